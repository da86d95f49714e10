"""Stage 1 of `build`: read and tokenise one work unit into work files.

Each unit becomes a work file of raw token ids plus per-document lengths and two seeded
hashes of the document's key (one ranks it for the validation draw, one picks its train
shard). A unit is complete once its JSON record is written (atomically, last), so a crash
loses at most the units in flight.
"""

from __future__ import annotations

import hashlib
import os
import signal
import time
from dataclasses import dataclass
from itertools import chain
from typing import Optional

import numpy as np

from data_prep.config import BuildConfig
from pretrain.faults import DataError, naming_output
from data_prep.manifest import read_json, write_json_atomic
from data_prep.readers import iter_unit
from data_prep.units import Unit
from data_prep.tokenizers import Tokenizer
from data_prep.writer import token_dtype

SKIP_LOG_LIMIT = 50  # skip messages kept per unit (all skips are counted)


@dataclass
class WorkerContext:
    """What every tokenising (and assembling) worker needs; set once per process by `init_worker`."""

    tokenizer: Tokenizer
    config: BuildConfig
    work_dir: str
    fingerprint: str

    @property
    def dtype(self) -> type:
        """numpy dtype of token ids for this tokenizer."""
        return token_dtype(self.tokenizer.vocab_size)


_worker_context: Optional[WorkerContext] = None  # the pool initializer loads the tokenizer once per worker


def init_worker(context: WorkerContext) -> None:
    """Pool initializer (also called in-process when there is a single worker)."""
    global _worker_context
    _worker_context = context


def init_pool_worker(context: WorkerContext) -> None:
    """init_worker in a pool process, which leaves Ctrl-C to the build's main process: a terminal sends SIGINT to
    the whole foreground group, and each worker would print its own KeyboardInterrupt traceback (the main process
    reports it in one line and terminates the pool)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    init_worker(context)


def unit_paths(work_dir: str, index: int) -> dict:
    """Work file paths of unit `index`: token ids, per-document metadata, completion record."""
    base = os.path.join(work_dir, f"u{index:06d}")
    return {"tok": base + ".tok", "meta": base + ".npz", "json": base + ".json"}


def completed_unit_record(work_dir: str, index: int, fingerprint: str) -> Optional[dict]:
    """The unit's record if its work files are complete and intact, else None."""
    paths = unit_paths(work_dir, index)
    record = read_json(paths["json"])
    if not record or record.get("fingerprint") != fingerprint:
        return None
    try:
        if (os.path.getsize(paths["tok"]) != record["tok_bytes"]
                or os.path.getsize(paths["meta"]) != record["meta_bytes"]):
            return None
    except OSError:
        return None
    return record


def document_hashes(seed: int, keys: list[str], num_shards: int) -> tuple[np.ndarray, np.ndarray]:
    """(valid-draw score, train shard) per document key, from a seeded 128-bit hash."""
    salt = f"{seed}\x00".encode()
    scores = np.empty(len(keys), dtype=np.uint64)
    shards = np.empty(len(keys), dtype=np.int32)
    for i, key in enumerate(keys):
        digest = hashlib.blake2b(salt + key.encode("utf-8", "surrogatepass"), digest_size=16).digest()
        scores[i] = int.from_bytes(digest[:8], "big")
        shards[i] = int.from_bytes(digest[8:], "big") % num_shards
    return scores, shards


class _UnitTokenizer:
    """Accumulates one unit's documents in batches and streams their token ids to the work file."""

    def __init__(self, context: WorkerContext, out) -> None:
        self.context, self.out = context, out
        self.keys: list[str] = []
        self.lengths: list[int] = []
        self.tokens = 0
        self.empty = 0  # documents that encode to no tokens at all
        self._batch_keys: list[str] = []
        self._batch_texts: list[str] = []

    def add(self, key: str, text: str) -> None:
        """Queue one document; encodes when the batch is full."""
        self._batch_keys.append(key)
        self._batch_texts.append(text)
        if len(self._batch_texts) >= self.context.config.batch_docs:
            self.flush()

    def flush(self) -> None:
        """Encode the queued documents and append their ids (each followed by EOD if asked) to the work file."""
        if not self._batch_texts:
            return
        append_eod = self.context.config.append_eod
        encoded = self.context.tokenizer.encode_batch(self._batch_texts)
        kept = [(key, ids) for key, ids in zip(self._batch_keys, encoded) if ids]
        self.empty += len(encoded) - len(kept)
        eod = (self.context.tokenizer.eod,) if append_eod else ()
        n = sum(len(ids) + len(eod) for _, ids in kept)
        ids_iter = chain.from_iterable(chain.from_iterable((ids, eod) for _, ids in kept))
        self.out.write(np.fromiter(ids_iter, dtype=self.context.dtype, count=n).data)
        self.tokens += n
        self.lengths.extend(len(ids) + len(eod) for _, ids in kept)
        self.keys.extend(key for key, _ in kept)
        self._batch_keys.clear()
        self._batch_texts.clear()


def tokenize_unit(task: tuple[int, Unit]) -> dict:
    """Stage 1 for one unit: read, tokenise, write work files; returns the unit's record."""
    index, unit = task
    context = _worker_context
    config = context.config
    paths = unit_paths(context.work_dir, index)
    skipped: dict[str, int] = {}
    skip_log: list[str] = []
    replaced = {"documents": 0, "replacements": 0, "log": []}  # --invalid-utf8 replace: what was decoded as U+FFFD
    docs_read = 0
    started = time.time()

    with naming_output(paths["tok"], partial=(paths["tok"] + ".partial",)), \
            open(paths["tok"] + ".partial", "wb") as out:
        encoder = _UnitTokenizer(context, out)
        for record in iter_unit(unit):
            docs_read += 1
            if record.skip_reason is None:
                if record.replacements:
                    replaced["documents"] += 1
                    replaced["replacements"] += record.replacements
                    if len(replaced["log"]) < SKIP_LOG_LIMIT:
                        replaced["log"].append(f"{record.where}: {record.replacements} invalid UTF-8 sequence(s) "
                                               "decoded as U+FFFD")
                encoder.add(record.key, record.text)
                continue
            message = f"{record.where}: {record.skip_reason}: {record.message}"
            if config.strict:
                raise DataError(f"--strict: {message}")
            skipped[record.skip_reason] = skipped.get(record.skip_reason, 0) + 1
            if len(skip_log) < SKIP_LOG_LIMIT:
                skip_log.append(message)
        encoder.flush()
    if encoder.empty:
        skipped["empty"] = skipped.get("empty", 0) + encoder.empty
        if len(skip_log) < SKIP_LOG_LIMIT:
            skip_log.append(f"{unit.name}: empty: {encoder.empty} document(s) encode to no tokens")

    if len(set(encoder.keys)) != len(encoder.keys):  # keys name the document's place in the corpus
        raise DataError(f"{unit.name}: duplicate document keys (same file given twice?); fix: pass each input once")
    scores, shards = document_hashes(config.seed, encoder.keys, config.num_shards)
    with naming_output(paths["meta"], partial=(paths["tok"] + ".partial", paths["meta"] + ".partial")), \
            open(paths["meta"] + ".partial", "wb") as fh:
        np.savez(fh, lengths=np.asarray(encoder.lengths, dtype=np.int64), scores=scores, shards=shards)
    os.replace(paths["tok"] + ".partial", paths["tok"])
    os.replace(paths["meta"] + ".partial", paths["meta"])
    unit_record = {
        "fingerprint": context.fingerprint, "unit": unit.describe(), "docs_read": docs_read,
        "docs_ok": len(encoder.lengths), "tokens": encoder.tokens, "skipped": skipped, "skip_log": skip_log,
        "invalid_utf8_replaced": replaced,
        "in_bytes": unit.est_bytes, "tok_bytes": os.path.getsize(paths["tok"]),
        "meta_bytes": os.path.getsize(paths["meta"]), "seconds": time.time() - started,
    }
    write_json_atomic(paths["json"], unit_record)
    return unit_record
