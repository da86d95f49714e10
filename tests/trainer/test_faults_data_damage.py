"""Shard bytes overwritten after the build with every size kept: the trainer names the damaged file and the
rebuild in one line (exit 2) instead of a traceback or silent training on garbage.

Real data_prep shards damaged in place and real `python -m pretrain train` runs: ~10 s CPU each.
"""

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import TINY_TRAIN, one_error_line, run_train

INDEX_HEADER_BYTES = 34  # magic 9, version 8, dtype code 1, sequence count 8, document count 8


@pytest.fixture
def shards(tiny_shards, tmp_path):
    """A private copy of the tiny data_prep output, to damage; its prefix."""
    shutil.copytree(Path(tiny_shards).parent, tmp_path / "shards")
    return str(tmp_path / "shards" / Path(tiny_shards).name)


def overwrite(path, offset, data):
    size = os.path.getsize(path)
    with open(path, "r+b") as handle:
        handle.seek(offset)
        handle.write(data)
    assert os.path.getsize(path) == size


def train_line(prefix, tmp_path):
    return one_error_line(run_train([*TINY_TRAIN, f"data.data_path={prefix}", "schedule.train_iters=4",
                                     f"checkpoint.save={tmp_path / 'run'}"], check=False))


def test_index_lengths_overwritten_exit_2_naming_the_shard(shards, tmp_path):
    index = f"{shards}_00000_text_document.idx"
    overwrite(index, INDEX_HEADER_BYTES + 4, b"\xff" * 8)
    line = train_line(shards, tmp_path)
    assert f"{shards}_00000_text_document.bin has" in line and ".idx describes" in line, line
    assert "data_prep inspect" in line and "data_prep build" in line, line


def test_index_changed_but_consistent_is_caught_by_the_manifest_checksum(shards, tmp_path):
    """Two documents' boundary moved by one token: sizes, pointers and totals still agree, the sha256 does not."""
    index = f"{shards}_00001_text_document.idx"
    raw = bytearray(Path(index).read_bytes())
    count = int(np.frombuffer(raw, np.int64, 1, 18)[0])
    lengths = np.frombuffer(raw, np.int32, count, INDEX_HEADER_BYTES).copy()
    pointers = np.frombuffer(raw, np.int64, count, INDEX_HEADER_BYTES + 4 * count).copy()
    lengths[0] -= 1
    lengths[1] += 1
    pointers[1] -= np.dtype(np.uint16).itemsize
    overwrite(index, INDEX_HEADER_BYTES, lengths.tobytes() + pointers.tobytes())
    line = train_line(shards, tmp_path)
    assert f"{index}: sha256 differs from {shards}_manifest.json" in line and "data_prep build" in line, line


def test_token_ids_overwritten_in_a_bin_exit_2_naming_the_shard(shards, tmp_path):
    data = f"{shards}_00001_text_document.bin"
    overwrite(data, 0, b"\xff" * (os.path.getsize(data) // 2))
    line = train_line(shards, tmp_path)
    assert "token id 65535, outside the tokenizer's vocabulary of 512" in line, line
    assert f"shard {data} was overwritten" in line and "data_prep build" in line, line
