"""SHA-256 of files (streamed), of `.bin/.idx` pairs, and the sampled content hash resume relies on.

`sha256_file` is the project's one streamed file hash; use it instead of a local copy.
"""

from __future__ import annotations

import hashlib
import os
from typing import Sequence

_READ_BLOCK = 4 << 20
SAMPLE_BLOCK = 1 << 20  # bytes hashed at each of the start, middle and end of a large input


def _update_from_file(h, path: str) -> None:
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(_READ_BLOCK), b""):
            h.update(block)


def sha256_file(path: str) -> str:
    """SHA-256 hex digest of one file, read in blocks (constant memory)."""
    h = hashlib.sha256()
    _update_from_file(h, path)
    return h.hexdigest()


def sha256_files(paths: Sequence[str]) -> str:
    """SHA-256 hex digest of the concatenated bytes of several files, in order (a tokenizer's identity)."""
    h = hashlib.sha256()
    for p in paths:
        _update_from_file(h, p)
    return h.hexdigest()


def sampled_sha256(path: str) -> str:
    """SHA-256 of the size plus the first, middle and last MiB of a file (the whole file when <= 3 MiB).

    Hashing every byte of a multi-terabyte corpus on each resume would cost as much as reading
    it; three MiB per file catch edits at either end and in the middle, and the resume fingerprint
    adds size and mtime for edits elsewhere (an edit there that keeps both is not detected).
    """
    size = os.path.getsize(path)
    h = hashlib.sha256(f"{size}\x00".encode())
    with open(path, "rb") as fh:
        if size <= 3 * SAMPLE_BLOCK:
            h.update(fh.read())
        else:
            for offset in (0, size // 2 - SAMPLE_BLOCK // 2, size - SAMPLE_BLOCK):
                fh.seek(offset)
                h.update(fh.read(SAMPLE_BLOCK))
    return h.hexdigest()


def pair_checksums(prefix: str) -> dict:
    """Sizes and SHA-256 of a `.bin/.idx` pair, as recorded in the manifest."""
    return {
        "bin_bytes": os.path.getsize(prefix + ".bin"),
        "idx_bytes": os.path.getsize(prefix + ".idx"),
        "bin_sha256": sha256_file(prefix + ".bin"),
        "idx_sha256": sha256_file(prefix + ".idx"),
    }


def matches_checksums(prefix: str, record: dict) -> bool:
    """True if the pair on disk has exactly the sizes and hashes recorded in `record`."""
    try:
        if (os.path.getsize(prefix + ".bin") != record["bin_bytes"]
                or os.path.getsize(prefix + ".idx") != record["idx_bytes"]):
            return False  # cheap check first: hashing a large shard only when sizes agree
        return pair_checksums(prefix) == {k: record[k] for k in ("bin_bytes", "idx_bytes", "bin_sha256", "idx_sha256")}
    except (OSError, KeyError, TypeError):
        return False
