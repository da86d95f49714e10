"""The validation draw and stage 2 of `build`: gather documents from the work files into shards.

Split: the validation set is the N documents with the smallest seeded hash -- exactly a
seeded shuffle of the whole corpus followed by taking the first N, but computable while
streaming. The validation stream is written in that shuffled order.

Stage 2 (parallel over shards): shard s gathers, in corpus order, the training documents
whose second hash maps to s, and is written with Megatron-Core's IndexedDatasetBuilder.
Neither stage's result depends on unit scheduling, worker count or rank count.
"""

from __future__ import annotations

import os
import time
from typing import Iterator, Optional, Union

import numpy as np

from data_prep.checksums import matches_checksums, pair_checksums
from pretrain.faults import DataError
from data_prep.manifest import read_json, write_json_atomic
from data_prep.tokenize_stage import unit_paths

DEFAULT_VALID_FRACTION = 0.0005  # the OpenWebText/nanoGPT convention

OutputName = Union[int, str]  # a train shard index, or "valid"


def num_valid_documents(valid_docs: Optional[int], valid_fraction: Optional[float], total_docs: int) -> int:
    """How many documents the validation set holds (--valid-docs, else --valid-fraction of the corpus)."""
    if valid_docs is not None:
        n = valid_docs
    else:
        fraction = DEFAULT_VALID_FRACTION if valid_fraction is None else valid_fraction
        n = int(round(fraction * total_docs))
        if fraction > 0 and n == 0 and total_docs >= 2:
            n = 1  # a requested validation set is never silently empty
    if n < 0 or (n >= total_docs and total_docs > 0 and n > 0):
        raise DataError(f"validation set of {n} documents leaves no training documents (corpus has {total_docs}); "
                        "fix: lower --valid-docs / --valid-fraction")
    return n


def choose_valid(work_dir: str, num_units: int, num_valid: int) -> np.ndarray:
    """(unit, local index) of the num_valid lowest-score documents, in score order (= seeded shuffle).

    Streams over units keeping only the current best num_valid, so memory is O(num_valid + one unit).
    """
    best = np.zeros((0, 3), dtype=np.uint64)  # columns: score, unit, local index
    if num_valid == 0:
        return best[:, 1:].astype(np.int64)
    for unit in range(num_units):
        with np.load(unit_paths(work_dir, unit)["meta"]) as meta:
            scores = meta["scores"]
        if len(scores) == 0:
            continue
        candidates = np.stack([scores, np.full(len(scores), unit, np.uint64),
                               np.arange(len(scores), dtype=np.uint64)], axis=1)
        pool = np.concatenate([best, candidates])
        order = np.lexsort((pool[:, 2], pool[:, 1], pool[:, 0]))[:num_valid]
        best = pool[order]
    return best[:, 1:].astype(np.int64)


class _UnitTokens:
    """Read access to one unit's token work file."""

    def __init__(self, work_dir: str, unit: int, dtype) -> None:
        paths = unit_paths(work_dir, unit)
        with np.load(paths["meta"]) as meta:
            self.lengths, self.shards = meta["lengths"], meta["shards"]
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64)
        self.tokens = np.memmap(paths["tok"], dtype=dtype, mode="r") if self.offsets[-1] else np.zeros(0, dtype)

    def doc(self, i: int) -> np.ndarray:
        """Token ids of the unit's i-th kept document."""
        return self.tokens[self.offsets[i]: self.offsets[i + 1]]


def _shard_documents(work_dir: str, num_units: int, shard: int, valid_by_unit: dict, dtype) -> Iterator[np.ndarray]:
    for unit in range(num_units):
        tokens = _UnitTokens(work_dir, unit, dtype)
        mask = tokens.shards == shard
        if unit in valid_by_unit:
            mask[valid_by_unit[unit]] = False
        for i in np.flatnonzero(mask):
            yield tokens.doc(int(i))
        del tokens


def _valid_documents(work_dir: str, valid: np.ndarray, dtype) -> Iterator[np.ndarray]:
    cache: dict[int, _UnitTokens] = {}
    for unit, i in valid:
        unit = int(unit)
        if unit not in cache:
            cache[unit] = _UnitTokens(work_dir, unit, dtype)
        yield cache[unit].doc(int(i))


def _output_record_path(work_dir: str, name: OutputName) -> str:
    return os.path.join(work_dir, f"out_{name}.json")


def assemble(task: tuple) -> dict:
    """Stage 2 for one output (a train shard index, or 'valid'); returns its manifest entry."""
    from data_prep.writer import write_indexed

    name, prefix, work_dir, num_units, valid, fingerprint, dtype = task
    started = time.time()
    if name == "valid":
        documents = _valid_documents(work_dir, valid, dtype)
    else:
        valid_by_unit: dict[int, list[int]] = {}
        for unit, i in valid:
            valid_by_unit.setdefault(int(unit), []).append(int(i))
        documents = _shard_documents(work_dir, num_units, name, valid_by_unit, dtype)
    num_docs, num_tokens = write_indexed(prefix, documents, dtype)
    entry = {"name": name, "prefix": os.path.basename(prefix), "documents": num_docs, "tokens": num_tokens,
             **pair_checksums(prefix), "seconds": round(time.time() - started, 3)}
    write_json_atomic(_output_record_path(work_dir, name), {"fingerprint": fingerprint, **entry})
    return entry


def completed_output_entry(work_dir: str, name: OutputName, prefix: str, fingerprint: str,
                           previous_manifest: Optional[dict]) -> Optional[dict]:
    """The entry of an already-written output whose files still match their recorded checksums."""
    record = read_json(_output_record_path(work_dir, name))
    if record and record.get("fingerprint") == fingerprint and matches_checksums(prefix, record):
        record.pop("fingerprint")
        return record
    if previous_manifest and previous_manifest.get("fingerprint") == fingerprint:
        for entry in previous_manifest["shards"] + [previous_manifest["valid"]]:
            if entry["name"] == name and matches_checksums(prefix, entry):
                return dict(entry)
    return None
