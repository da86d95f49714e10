"""Streaming corpus readers: iterate the documents of one work unit (planned in data_prep.units).

Every document gets a *key* that depends only on where it lives in
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
import re
import tarfile
from dataclasses import dataclass
from typing import Iterator, Optional

from data_prep.units import Unit

_NEWLINES_3PLUS = re.compile("\n\n\n+")


def normalize(text: str) -> str:
    """Normalise like the Hugging Face OpenWebText loader: collapse 3+ newlines to 2, strip."""
    return _NEWLINES_3PLUS.sub("\n\n", text).strip()


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
    replacements: int = 0  # invalid UTF-8 sequences decoded as U+FFFD (--invalid-utf8 replace)


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


_REPLACEMENT = "\ufffd".encode()  # U+FFFD as valid UTF-8 in the input (not a replacement made here)


def _decode(raw: bytes, where: str, mode: str = "skip", what: str = "line") -> tuple[str, int]:
    """(text, invalid sequences replaced); under mode "skip" invalid UTF-8 raises ReadError with a fitting fix.

    `what` is "line" (a JSONL line) or "file" (a .txt file or archive member: one document).
    """
    try:
        return raw.decode("utf-8"), 0
    except UnicodeDecodeError as e:
        if mode == "replace":
            text = raw.decode("utf-8", errors="replace")
            # one U+FFFD per invalid sequence; EF BF BD starts with a lead byte, so no invalid sequence swallows it
            return text, text.count("\ufffd") - raw.count(_REPLACEMENT)
        if what == "file":
            fix = ("the whole file is one document, so all of it is skipped; fix: convert it to UTF-8 (e.g. "
                   "iconv -f latin1 -t utf-8) or pass --invalid-utf8 replace to keep it with U+FFFD for each bad byte")
        else:
            fix = "fix: repair the line, or pass --invalid-utf8 replace to keep it with U+FFFD for each bad byte"
        raise ReadError("invalid_utf8", where, f"invalid UTF-8 at byte {e.start} ({fix})") from None


def _doc(key: str, where: str, text: str, rule: str, replacements: int = 0) -> Record:
    if rule == "owt":
        text = normalize(text)
    if not text:
        # Megatron-LM's preprocess_data.py writes such a document with no tokens (not even EOD);
        # it contributes nothing to training, so it is counted as skipped instead.
        why = "empty document after normalisation" if rule == "owt" else "empty document"
        return Record(key, where, skip_reason="empty", message=why)
    return Record(key, where, text=text, replacements=replacements)


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
                line, replaced = _decode(raw, where, unit.invalid_utf8, "line")
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
            yield _doc(key, where, val, unit.normalize, replaced)


def _iter_txt(unit: Unit) -> Iterator[Record]:
    for path, name in unit.files:
        try:
            with open(path, "rb") as fh:
                raw = fh.read()
        except OSError as e:
            yield Record(name, name, skip_reason="unreadable_file", message=str(e))
            continue
        try:
            text, replaced = _decode(raw, name, unit.invalid_utf8, "file")
        except ReadError as e:
            yield Record(name, name, skip_reason=e.reason, message=e.detail)
            continue
        yield _doc(name, name, text, unit.normalize, replaced)


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


def _iter_txt_tar(tf: tarfile.TarFile, prefix: str, rule: str, invalid_utf8: str) -> Iterator[Record]:
    """Documents (`.txt` members) of an inner OpenWebText subset tar, or nested `.xz` tars."""
    for m in tf:
        if not m.isfile():
            continue
        where = f"{prefix}:{m.name}"
        fobj = tf.extractfile(m)
        data = fobj.read() if fobj is not None else b""
        if m.name.lower().endswith(".xz"):
            yield from _iter_inner_xz(io.BytesIO(data), where, rule, invalid_utf8)
            continue
        try:
            text, replaced = _decode(data, where, invalid_utf8, "file")
        except ReadError as e:
            yield Record(where, where, skip_reason=e.reason, message=e.detail)
            continue
        yield _doc(where, where, text, rule, replaced)


def _iter_inner_xz(fileobj, where: str, rule: str, invalid_utf8: str) -> Iterator[Record]:
    """An `urlsf_subset*.xz`: an xz-compressed tar of `.txt` documents, streamed."""
    try:
        with tarfile.open(fileobj=fileobj, mode="r|xz") as tf:
            yield from _iter_txt_tar(tf, where, rule, invalid_utf8)
    except (tarfile.TarError, lzma.LZMAError, EOFError, OSError) as e:
        yield Record(f"{where}!error", where, skip_reason="corrupt_archive",
                     message=f"truncated or corrupt archive ({type(e).__name__}: {e})")


def _iter_owt(unit: Unit) -> Iterator[Record]:
    if unit.member:  # one inner .xz of a plain tar, read in place
        where = f"{unit.name}:{unit.member}"
        yield from _iter_inner_xz(io.BufferedReader(_Window(unit.path, unit.start, unit.end)), where, unit.normalize,
                                  unit.invalid_utf8)
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
                yield from _iter_txt_tar(tf, unit.name, unit.normalize, unit.invalid_utf8)
        except (tarfile.TarError, lzma.LZMAError, EOFError, OSError) as e:
            yield Record(f"{unit.name}!error", unit.name, skip_reason="corrupt_archive",
                         message=f"truncated or corrupt archive ({type(e).__name__}: {e})")
