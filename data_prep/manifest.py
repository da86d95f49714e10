"""The JSON manifest written next to the shards, and its loader."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

MANIFEST_VERSION = 1


def manifest_path(output_prefix: str) -> str:
    """Where the manifest of `output_prefix` lives."""
    return os.path.abspath(output_prefix) + "_manifest.json"


def shard_prefix(output_prefix: str, shard: int) -> str:
    """Path prefix (no .bin/.idx) of train shard `shard`."""
    return f"{os.path.abspath(output_prefix)}_{shard:05d}_text_document"


def valid_prefix(output_prefix: str) -> str:
    """Path prefix (no .bin/.idx) of the validation stream."""
    return f"{os.path.abspath(output_prefix)}_valid_text_document"


@dataclass
class Manifest:
    """What a finished build produced; `raw` holds the whole JSON document."""

    train_prefixes: list[str]
    valid_prefix: str
    tokenizer_path: str
    vocab_size: int
    eod_id: int
    num_tokens: int
    num_valid_tokens: int
    raw: dict = field(repr=False, default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict, base_dir: str) -> "Manifest":
        """Build from the JSON dict; relative prefixes are resolved against the manifest's directory."""
        res = lambda p: p if os.path.isabs(p) else os.path.join(base_dir, p)  # noqa: E731
        return cls(
            train_prefixes=[res(s["prefix"]) for s in d["shards"]],
            valid_prefix=res(d["valid"]["prefix"]),
            tokenizer_path=d["tokenizer"]["path"],
            vocab_size=int(d["tokenizer"]["vocab_size"]),
            eod_id=int(d["tokenizer"]["eod_id"]),
            num_tokens=int(sum(s["tokens"] for s in d["shards"])),
            num_valid_tokens=int(d["valid"]["tokens"]),
            raw=d,
        )


def load_manifest(output_prefix: str) -> Manifest:
    """Load `OUTPUT_PREFIX_manifest.json` (also accepts the manifest path itself)."""
    path = output_prefix if output_prefix.endswith("_manifest.json") else manifest_path(output_prefix)
    with open(path) as fh:
        d = json.load(fh)
    return Manifest.from_dict(d, os.path.dirname(os.path.abspath(path)))


def write_json_atomic(path: str, obj: Any) -> None:
    """Write JSON so a crash leaves either the old file or the new one, never half of one."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(obj, fh, indent=1, sort_keys=False)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def read_json(path: str) -> Any:
    """JSON content of `path`, or None if missing or unreadable (e.g. half-written)."""
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None
