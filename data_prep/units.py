"""Planning: split the inputs into work units, the smallest independently readable pieces.

A *unit* is a byte range of a plain JSONL file, a compressed file, a parquet row group, an
inner `.xz` of a plain tar, or a group of small `.txt` files. The same inputs always give
the same units, and each unit carries the normalisation rule its documents get.
"""

from __future__ import annotations

import os
import tarfile
from dataclasses import dataclass, field
from typing import Optional

FORMATS = ("auto", "owt", "jsonl", "parquet", "arrow", "txt")
NORMALIZE_RULES = ("auto", "none", "owt")  # auto: "owt" for OpenWebText archives, "none" for every other format
INVALID_UTF8_MODES = ("skip", "replace")  # a document that is not valid UTF-8: skipped, or decoded with U+FFFD

_JSONL_SUFFIXES = (".jsonl", ".json", ".jsonl.gz", ".json.gz", ".jsonl.zst", ".json.zst", ".ndjson")


def resolve_normalize(requested: str, fmt: str) -> str:
    """The rule ("none" or "owt") applied to documents of format `fmt` when `requested` was asked for."""
    if requested not in NORMALIZE_RULES:
        raise ValueError(f"unknown --normalize {requested!r}; choose from {NORMALIZE_RULES}")
    if requested == "auto":
        return "owt" if fmt == "owt" else "none"
    return requested


@dataclass
class Unit:
    """An independently readable slice of the input."""

    fmt: str
    path: str  # absolute path of the file
    name: str  # stable display name (relative to the input argument)
    est_bytes: int  # on-disk bytes, for progress/ETA and load balancing
    start: int = 0  # jsonl byte range / owt inner member offset
    end: int = -1
    first_line: int = 1  # jsonl: line number of the first line at `start`
    member: str = ""  # owt plain tar: inner member name
    row_group: int = -1  # parquet
    first_row: int = 0  # parquet: global index of the row group's first row
    files: list = field(default_factory=list)  # txt: [(path, name)]
    jsonl_key: str = "text"
    normalize: str = "none"  # the resolved rule: "none" or "owt"
    invalid_utf8: str = "skip"  # "skip" or "replace" (INVALID_UTF8_MODES)

    def describe(self) -> dict:
        """A JSON-able identity of this unit (used to detect a changed plan on resume)."""
        d = {"fmt": self.fmt, "name": self.name, "bytes": self.est_bytes, "normalize": self.normalize}
        if self.invalid_utf8 != "skip":  # absent by default: plans made before the option keep their identity
            d["invalid_utf8"] = self.invalid_utf8
        if self.fmt == "jsonl":
            d.update(start=self.start, end=self.end)
        if self.member:
            d["member"] = self.member
        if self.row_group >= 0:
            d["row_group"] = self.row_group
        if self.files:
            d["files"] = [n for _, n in self.files]
        return d


def detect_format(path: str) -> Optional[str]:
    """Format of a single file from its name, or None if it is not a corpus file."""
    low = path.lower()
    if low.endswith(".parquet"):
        return "parquet"
    if low.endswith(".arrow"):
        return "arrow"
    if low.endswith(_JSONL_SUFFIXES):
        return "jsonl"
    if low.endswith((".xz", ".tar", ".tar.xz", ".txz")):
        return "owt"
    if low.endswith(".txt"):
        return "txt"
    return None


def _list_files(root: str) -> list[tuple[str, str]]:
    """All files under `root` as (abs path, name relative to root's parent), sorted for determinism."""
    out = []
    base = os.path.dirname(os.path.abspath(root).rstrip(os.sep))
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for f in filenames:
            if f.startswith("."):
                continue
            p = os.path.abspath(os.path.join(dirpath, f))
            out.append((p, os.path.relpath(p, base)))
    return sorted(out, key=lambda t: t[1])


def plan_units(inputs: list[str], fmt: str = "auto", jsonl_key: str = "text",
               chunk_bytes: int = 4 << 20, normalize: str = "auto", invalid_utf8: str = "skip") -> list[Unit]:
    """Split the inputs into deterministic work units (same inputs -> same units)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose from {FORMATS}")
    if invalid_utf8 not in INVALID_UTF8_MODES:
        raise ValueError(f"unknown --invalid-utf8 {invalid_utf8!r}; choose from {INVALID_UTF8_MODES}")
    resolve_normalize(normalize, "jsonl")  # reject an unknown rule before any work
    files: list[tuple[str, str, str]] = []  # (path, name, fmt)
    for inp in inputs:
        if not os.path.exists(inp):
            raise FileNotFoundError(f"input does not exist: {inp}")
        listed = _list_files(inp) if os.path.isdir(inp) else [(os.path.abspath(inp), os.path.basename(inp))]
        for p, name in listed:
            f = fmt if fmt != "auto" else detect_format(p)
            if f is not None:
                files.append((p, name, f))
    if not files:
        raise ValueError(f"no corpus files found in {inputs} (format {fmt})")

    units: list[Unit] = []
    txt_group: list[tuple[str, str]] = []
    txt_bytes = 0

    def flush_txt() -> None:
        nonlocal txt_group, txt_bytes
        if txt_group:
            units.append(Unit("txt", txt_group[0][0], txt_group[0][1], txt_bytes, files=txt_group))
        txt_group, txt_bytes = [], 0

    for path, name, f in files:
        size = _size(path)
        if f == "txt":
            # Many tiny documents: group them so work files stay few.
            txt_group.append((path, name))
            txt_bytes += size
            if txt_bytes >= chunk_bytes:
                flush_txt()
            continue
        flush_txt()
        if f == "jsonl":
            units.extend(_plan_jsonl(path, name, size, chunk_bytes, jsonl_key))
        elif f == "parquet":
            units.extend(_plan_parquet(path, name, size, jsonl_key))
        elif f == "owt":
            units.extend(_plan_owt(path, name, size))
        else:
            units.append(Unit(f, path, name, size, jsonl_key=jsonl_key))
    flush_txt()
    for unit in units:
        unit.normalize = resolve_normalize(normalize, unit.fmt)
        unit.invalid_utf8 = invalid_utf8
    return units


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _plan_jsonl(path: str, name: str, size: int, chunk_bytes: int, key: str) -> list[Unit]:
    """Plain JSONL is cut into newline-aligned byte ranges; compressed files are one unit."""
    if path.lower().endswith((".gz", ".zst")) or size <= chunk_bytes:
        return [Unit("jsonl", path, name, size, 0, -1, 1, jsonl_key=key)]
    units = []
    try:
        with open(path, "rb") as fh:
            start, line = 0, 1
            while start < size:
                # Count newlines up to the next boundary so every unit knows its first line number.
                want = start + chunk_bytes
                buf = fh.read(max(0, want - start))
                rest = b""
                if len(buf) == want - start:
                    rest = fh.readline()
                data = buf + rest
                end = start + len(data)
                units.append(Unit("jsonl", path, name, len(data), start, end, line, jsonl_key=key))
                line += data.count(b"\n")
                start = end
                if not data:
                    break
    except OSError:
        return [Unit("jsonl", path, name, size, 0, -1, 1, jsonl_key=key)]
    return units


def _plan_parquet(path: str, name: str, size: int, key: str) -> list[Unit]:
    """One unit per row group (bounded memory, parallel within a file)."""
    try:
        import pyarrow.parquet as pq

        meta = pq.ParquetFile(path).metadata
    except Exception:  # corrupt file: a single unit whose reading reports the error
        return [Unit("parquet", path, name, size, jsonl_key=key)]
    units, row = [], 0
    n = max(1, meta.num_row_groups)
    for rg in range(meta.num_row_groups):
        units.append(Unit("parquet", path, name, size // n, row_group=rg, first_row=row, jsonl_key=key))
        row += meta.row_group(rg).num_rows
    return units


def _plan_owt(path: str, name: str, size: int) -> list[Unit]:
    """A plain tar of inner `.xz` archives is split per member (seekable); anything else is one unit."""
    low = path.lower()
    if low.endswith(".tar") and not low.endswith(".tar.xz"):
        try:
            units = []
            with tarfile.open(path, "r:") as tf:
                for m in tf:
                    if m.isfile() and m.name.lower().endswith(".xz"):
                        units.append(Unit("owt", path, name, m.size, start=m.offset_data,
                                          end=m.offset_data + m.size, member=m.name))
            if units:
                return units
        except (tarfile.TarError, OSError, EOFError):
            pass  # read as one unit; the reader reports the corruption with its location
    return [Unit("owt", path, name, size)]
