"""Shard writing through Megatron-Core's own IndexedDatasetBuilder, and .idx/.bin consistency checks.

Megatron is imported inside functions only, so reading and tokenising stay a light install.
"""

from __future__ import annotations

import os
import threading
from typing import Callable, Iterable

import numpy as np

from pretrain.faults import naming_output

# Megatron's DType.optimal_dtype rule (cardinality < 65500 -> uint16, else int32); repeated here
# so tokenising workers need not import megatron/torch. A test checks it matches Megatron's.
UINT16_MAX_VOCAB = 65500


def megatron_indexed():
    """Megatron-Core's indexed_dataset module, imported on first use (pulls in torch)."""
    import warnings

    from megatron_ext import import_shims

    import_shims.install()  # megatron-core 0.19+ imports triton with its package; a CPU machine has none
    with warnings.catch_warnings():
        # megatron.core's package import warns about optional Transformer Engine/Apex; irrelevant here.
        warnings.simplefilter("ignore")
        from megatron.core.datasets import indexed_dataset
    return indexed_dataset


def import_megatron_in_background() -> Callable[[], None]:
    """Start importing Megatron-Core on a thread; returns a function that waits for it (re-raising its error).

    The import costs ~4 CPU-seconds (torch + megatron.core's package imports) and is needed only to
    write shards, so it runs while the tokenising workers work instead of after them. Call it only
    after the worker pool has forked: a fork during an import can leave the child holding its lock.
    """
    failure: list[BaseException] = []

    def target() -> None:
        try:
            megatron_indexed()
        except BaseException as e:  # surfaced by wait(), in the main thread
            failure.append(e)

    thread = threading.Thread(target=target, name="megatron-import", daemon=True)
    thread.start()

    def wait() -> None:
        thread.join()
        if failure:
            raise failure[0]

    return wait


def token_dtype(vocab_size: int) -> type:
    """numpy dtype for token ids: uint16 when the vocabulary fits, int32 otherwise."""
    return np.uint16 if vocab_size < UINT16_MAX_VOCAB else np.int32


def write_indexed(prefix: str, docs: Iterable[np.ndarray], dtype: type) -> tuple[int, int]:
    """Write documents (one token array each) as `prefix.bin/.idx`; returns (documents, tokens).

    Written under temporary names and renamed at the end, so a crash never leaves a
    complete-looking pair behind.
    """
    IndexedDatasetBuilder = megatron_indexed().IndexedDatasetBuilder
    tmp_bin, tmp_idx = prefix + ".bin.partial", prefix + ".idx.partial"
    n_docs = n_tok = 0
    # finalize() flushes the .bin's last buffer too, so a full disk there is still about the .bin.
    with naming_output(prefix + ".bin", partial=(tmp_bin, tmp_idx)):
        builder = IndexedDatasetBuilder(tmp_bin, dtype=dtype)
        for arr in docs:
            builder.add_document(arr, [int(arr.size)])
            n_docs += 1
            n_tok += int(arr.size)
        builder.finalize(tmp_idx)
    os.replace(tmp_bin, prefix + ".bin")
    os.replace(tmp_idx, prefix + ".idx")
    return n_docs, n_tok


def open_pair(prefix: str):
    """Megatron's IndexedDataset over `prefix.idx`/`.bin`; an empty .bin (e.g. `--valid-docs 0`) is read without
    mmap, which cannot map an empty file."""
    return megatron_indexed().IndexedDataset(prefix, mmap=os.path.getsize(prefix + ".bin") > 0)


INDEX_HEADER = b"MMIDIDX\x00\x00"  # the first bytes of every Megatron .idx (megatron.core.datasets.indexed_dataset)


def check_pair(prefix: str) -> list[str]:
    """Consistency problems between `prefix.idx` and `prefix.bin` (empty list when sound)."""
    problems = []
    for ext in (".bin", ".idx"):
        if not os.path.exists(prefix + ext):
            return [f"missing {prefix + ext}"]
    with open(prefix + ".idx", "rb") as index:
        if index.read(len(INDEX_HEADER)) != INDEX_HEADER:  # checked here: Megatron's reader asserts, then its
            return [f"{prefix}.idx unreadable: not a Megatron index (bad header: zeroed or overwritten)"]  # __del__ fails
    try:
        ds = open_pair(prefix)
    except Exception as e:  # malformed header / truncated index
        return [f"{prefix}.idx unreadable: {type(e).__name__}: {e}"]
    idx = ds.index
    lengths = np.asarray(idx.sequence_lengths, dtype=np.int64)
    pointers = np.asarray(idx.sequence_pointers, dtype=np.int64)
    doc_idx = np.asarray(idx.document_indices, dtype=np.int64)
    itemsize = np.dtype(idx.dtype).itemsize
    expect = int(lengths.sum()) * itemsize
    actual = os.path.getsize(prefix + ".bin")
    if expect != actual:
        problems.append(f"{prefix}.bin has {actual} bytes but .idx describes {expect}")
    if len(lengths) and not np.array_equal(pointers, np.concatenate([[0], np.cumsum(lengths[:-1]) * itemsize])):
        problems.append(f"{prefix}.idx sequence pointers are not contiguous")
    if len(doc_idx) == 0 or doc_idx[0] != 0 or doc_idx[-1] != len(lengths) or np.any(np.diff(doc_idx) < 0):
        problems.append(f"{prefix}.idx document indices are inconsistent")
    return problems
