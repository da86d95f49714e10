"""Streaming corpus readers: plan work units, then iterate a unit's documents.

A *unit* is the smallest independently readable piece of input (a byte range of a plain
JSONL file, a compressed file, a parquet row group, an inner `.xz` of a plain tar, a group
of small `.txt` files). Every document gets a *key* that depends only on where it lives in
the corpus (file, member, line/row), never on how units were cut or which worker read it;
the key seeds the train/valid split and shard assignment, which is what makes the output
independent of worker and rank counts.

Text is passed on exactly as stored (rule "none", what Megatron-LM's preprocess_data.py
encodes) except under rule "owt", the Hugging Face openwebtext loader's cleanup, which is the
default for OpenWebText archives only.
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import os
import re
import tarfile
from dataclasses import dataclass, field
from typing import Iterator, Optional

FORMATS = ("auto", "owt", "jsonl", "parquet", "arrow", "txt")
NORMALIZE_RULES = ("auto", "none", "owt")  # auto: "owt" for OpenWebText archives, "none" for every other format

_JSONL_SUFFIXES = (".jsonl", ".json", ".jsonl.gz", ".json.gz", ".jsonl.zst", ".json.zst", ".ndjson")
_NEWLINES_3PLUS = re.compile("\n\n\n+")


def normalize(text: str) -> str:
    """Normalise like the Hugging Face OpenWebText loader: collapse 3+ newlines to 2, strip."""
    return _NEWLINES_3PLUS.sub("\n\n", text).strip()


def resolve_normalize(requested: str, fmt: str) -> str:
    """The rule ("none" or "owt") applied to documents of format `fmt` when `requested` was asked for."""
    if requested not in NORMALIZE_RULES:
        raise ValueError(f"unknown --normalize {requested!r}; choose from {NORMALIZE_RULES}")
    if requested == "auto":
        return "owt" if fmt == "owt" else "none"
    return requested


class ReadError(Exception):
    """A document or source could not be read; `reason` is the accounting bucket."""

    def __init__(self, reason: str, where: str, detail: str) -> None:
        super().__init__(f"{reason}: {where}: {detail}")
        self.reason, self.where, self.detail = reason, where, detail


@dataclass
class Record:
    """One document read from the corpus: text, or the reason it had to be skipped."""

    key: str
    where: str  # human-readable location: file[:member][:line N]
    text: Optional[str] = None
    skip_reason: Optional[str] = None
    message: str = ""


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

    def describe(self) -> dict:
        """A JSON-able identity of this unit (used to detect a changed plan on resume)."""
        d = {"fmt": self.fmt, "name": self.name, "bytes": self.est_bytes, "normalize": self.normalize}
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
               chunk_bytes: int = 4 << 20, normalize: str = "auto") -> list[Unit]:
    """Split the inputs into deterministic work units (same inputs -> same units)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose from {FORMATS}")
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


# ----------------------------------------------------------------------------- reading


def iter_unit(unit: Unit) -> Iterator[Record]:
    """Stream the documents of one unit; failures come back as skip records, never exceptions."""
    try:
        if unit.fmt == "jsonl":
            yield from _iter_jsonl(unit)
        elif unit.fmt == "txt":
            yield from _iter_txt(unit)
        elif unit.fmt == "parquet":
            yield from _iter_parquet(unit)
        elif unit.fmt == "arrow":
            yield from _iter_arrow(unit)
        elif unit.fmt == "owt":
            yield from _iter_owt(unit)
        else:
            raise ValueError(f"unknown unit format {unit.fmt}")
    except ReadError as e:
        yield Record(f"{unit.name}#{unit.start}#{unit.member}#{unit.row_group}!error", e.where,
                     skip_reason=e.reason, message=e.detail)
    except OSError as e:
        yield Record(f"{unit.name}#{unit.start}#{unit.member}#{unit.row_group}!error", unit.name,
                     skip_reason="unreadable_file", message=str(e))


def _decode(raw: bytes, where: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ReadError("invalid_utf8", where, f"invalid UTF-8 at byte {e.start}") from None


def _doc(key: str, where: str, text: str, rule: str) -> Record:
    if rule == "owt":
        text = normalize(text)
    if not text:
        # Megatron-LM's preprocess_data.py writes such a document with no tokens (not even EOD);
        # it contributes nothing to training, so it is counted as skipped instead.
        why = "empty document after normalisation" if rule == "owt" else "empty document"
        return Record(key, where, skip_reason="empty", message=why)
    return Record(key, where, text=text)


def _open_text_stream(path: str) -> io.BufferedIOBase:
    low = path.lower()
    if low.endswith(".gz"):
        return gzip.open(path, "rb")
    if low.endswith(".zst"):
        import zstandard

        # Frames written by `zstd --long` need a larger window than the default.
        dctx = zstandard.ZstdDecompressor(max_window_size=2**31)
        return io.BufferedReader(dctx.stream_reader(open(path, "rb"), closefd=True))
    if low.endswith(".bz2"):
        return bz2.open(path, "rb")
    return open(path, "rb")


def _iter_jsonl(unit: Unit) -> Iterator[Record]:
    try:
        fh = _open_text_stream(unit.path)
    except OSError as e:
        raise ReadError("unreadable_file", unit.name, str(e)) from None
    with fh:
        if unit.start:
            fh.seek(unit.start)
        pos, lineno = unit.start, unit.first_line
        while unit.end < 0 or pos < unit.end:
            try:
                raw = fh.readline()
            except (EOFError, OSError, lzma.LZMAError, Exception) as e:  # truncated gz/zst
                if isinstance(e, (KeyboardInterrupt, SystemExit)):
                    raise
                raise ReadError("corrupt_archive", f"{unit.name}:line {lineno}",
                                f"stream ended or is corrupt ({type(e).__name__}: {e})") from None
            if not raw:
                break
            pos += len(raw)
            key, where = f"{unit.name}:{lineno}", f"{unit.name}:line {lineno}"
            lineno += 1
            if not raw.strip():
                continue  # blank lines are not documents
            try:
                line = _decode(raw, where)
            except ReadError as e:
                yield Record(key, where, skip_reason=e.reason, message=e.detail)
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                yield Record(key, where, skip_reason="invalid_json", message=str(e))
                continue
            if not isinstance(obj, dict) or unit.jsonl_key not in obj:
                yield Record(key, where, skip_reason="missing_key",
                             message=f"no key {unit.jsonl_key!r} in JSON object")
                continue
            val = obj[unit.jsonl_key]
            if not isinstance(val, str):
                yield Record(key, where, skip_reason="missing_key",
                             message=f"key {unit.jsonl_key!r} is {type(val).__name__}, not a string")
                continue
            yield _doc(key, where, val, unit.normalize)


def _iter_txt(unit: Unit) -> Iterator[Record]:
    for path, name in unit.files:
        try:
            with open(path, "rb") as fh:
                raw = fh.read()
        except OSError as e:
            yield Record(name, name, skip_reason="unreadable_file", message=str(e))
            continue
        try:
            yield _doc(name, name, _decode(raw, name), unit.normalize)
        except ReadError as e:
            yield Record(name, name, skip_reason=e.reason, message=e.detail)


def _iter_table_batches(batches, unit: Unit, first_row: int) -> Iterator[Record]:
    row = first_row
    for batch in batches:
        if unit.jsonl_key not in batch.schema.names:
            raise ReadError("missing_key", unit.name, f"no column {unit.jsonl_key!r} (columns: {batch.schema.names})")
        for val in batch.column(unit.jsonl_key).to_pylist():
            key, where = f"{unit.name}:{row}", f"{unit.name}:row {row}"
            row += 1
            if not isinstance(val, str):
                yield Record(key, where, skip_reason="missing_key", message=f"{unit.jsonl_key!r} is null/not a string")
            else:
                yield _doc(key, where, val, unit.normalize)


def _iter_parquet(unit: Unit) -> Iterator[Record]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(unit.path)
        groups = [unit.row_group] if unit.row_group >= 0 else list(range(pf.metadata.num_row_groups))
        if unit.jsonl_key not in pf.schema_arrow.names:
            raise ReadError("missing_key", unit.name, f"no column {unit.jsonl_key!r} (columns: {pf.schema_arrow.names})")
        batches = pf.iter_batches(batch_size=1024, row_groups=groups, columns=[unit.jsonl_key])
        yield from _iter_table_batches(batches, unit, unit.first_row)
    except (pa.ArrowException, OSError) as e:
        raise ReadError("corrupt_archive", f"{unit.name}" + (f":row group {unit.row_group}" if unit.row_group >= 0 else ""),
                        f"{type(e).__name__}: {e}") from None


def _iter_arrow(unit: Unit) -> Iterator[Record]:
    import pyarrow as pa

    try:
        src = pa.memory_map(unit.path, "r")
        try:  # Arrow IPC file format
            reader = pa.ipc.open_file(src)
            batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
        except pa.ArrowInvalid:  # Hugging Face `datasets` writes the IPC *stream* format
            src.seek(0)
            batches = pa.ipc.open_stream(src)
        yield from _iter_table_batches(batches, unit, 0)
    except (pa.ArrowException, OSError) as e:
        raise ReadError("corrupt_archive", unit.name, f"{type(e).__name__}: {e}") from None


class _Window(io.RawIOBase):
    """A read-only view of bytes [start, end) of a file (an inner member of a plain tar)."""

    def __init__(self, path: str, start: int, end: int) -> None:
        self._fh = open(path, "rb")
        self._fh.seek(start)
        self._left = end - start

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        n = min(len(b), self._left)
        if n <= 0:
            return 0
        data = self._fh.read(n)
        b[: len(data)] = data
        self._left -= len(data)
        return len(data)

    def close(self) -> None:
        self._fh.close()
        super().close()


def _iter_txt_tar(tf: tarfile.TarFile, prefix: str, rule: str) -> Iterator[Record]:
    """Documents (`.txt` members) of an inner OpenWebText subset tar, or nested `.xz` tars."""
    for m in tf:
        if not m.isfile():
            continue
        where = f"{prefix}:{m.name}"
        fobj = tf.extractfile(m)
        data = fobj.read() if fobj is not None else b""
        if m.name.lower().endswith(".xz"):
            yield from _iter_inner_xz(io.BytesIO(data), where, rule)
            continue
        try:
            yield _doc(where, where, _decode(data, where), rule)
        except ReadError as e:
            yield Record(where, where, skip_reason=e.reason, message=e.detail)


def _iter_inner_xz(fileobj, where: str, rule: str) -> Iterator[Record]:
    """An `urlsf_subset*.xz`: an xz-compressed tar of `.txt` documents, streamed."""
    try:
        with tarfile.open(fileobj=fileobj, mode="r|xz") as tf:
            yield from _iter_txt_tar(tf, where, rule)
    except (tarfile.TarError, lzma.LZMAError, EOFError, OSError) as e:
        yield Record(f"{where}!error", where, skip_reason="corrupt_archive",
                     message=f"truncated or corrupt archive ({type(e).__name__}: {e})")


def _iter_owt(unit: Unit) -> Iterator[Record]:
    if unit.member:  # one inner .xz of a plain tar, read in place
        where = f"{unit.name}:{unit.member}"
        yield from _iter_inner_xz(io.BufferedReader(_Window(unit.path, unit.start, unit.end)), where, unit.normalize)
        return
    low = unit.path.lower()
    try:
        fh = open(unit.path, "rb")
    except OSError as e:
        raise ReadError("unreadable_file", unit.name, str(e)) from None
    with fh:
        if low.endswith(".tar") and not low.endswith(".tar.xz"):
            mode = "r|"
        else:
            mode = "r|xz"  # urlsf_subset*.xz and openwebtext.tar.xz are both xz'd tars
        try:
            with tarfile.open(fileobj=fh, mode=mode) as tf:
                yield from _iter_txt_tar(tf, unit.name, unit.normalize)
        except (tarfile.TarError, lzma.LZMAError, EOFError, OSError) as e:
            yield Record(f"{unit.name}!error", unit.name, skip_reason="corrupt_archive",
                         message=f"truncated or corrupt archive ({type(e).__name__}: {e})")
