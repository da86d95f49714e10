"""A data_prep build that cannot feed the run: one line naming the build and the fix, exit 2, no traceback.

Real data_prep builds and `python -m pretrain train` runs (which stop before the first step): ~10 s CPU.
"""

import shutil
from pathlib import Path

import pytest

from conftest import TINY_TRAIN, one_error_line, run_train


def test_build_with_fewer_tokens_than_one_sequence_exits_2(tiny_shards, tmp_path):
    from data_prep.cli import main as data_prep

    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "short.txt").write_text("A few words only.\n")
    tokenizer = Path(tiny_shards).parents[1] / "tok" / "tokenizer.model"
    prefix = str(tmp_path / "short")
    assert data_prep(["build", "--input", str(tmp_path / "corpus"), "--tokenizer", str(tokenizer),
                      "--data-prefix", prefix, "--valid-docs", "0", "--no-progress"]) == 0
    line = one_error_line(run_train([*TINY_TRAIN, f"data.data_path={prefix}", "schedule.train_iters=4",
                                     f"checkpoint.save={tmp_path / 'run'}"], check=False))
    assert f"data.data_path={prefix!r}" in line and "fewer than one sequence" in line and "model.seq_length" in line


@pytest.mark.parametrize("damage", ["deleted", "truncated"])
def test_shard_changed_after_the_build_exits_2_naming_it(tiny_shards, tmp_path, damage):
    shutil.copytree(Path(tiny_shards).parent, tmp_path / "shards")
    prefix = str(tmp_path / "shards" / Path(tiny_shards).name)
    shard = Path(f"{prefix}_00001_text_document.bin")
    shard.unlink() if damage == "deleted" else shard.write_bytes(shard.read_bytes()[:100])
    line = one_error_line(run_train([*TINY_TRAIN, f"data.data_path={prefix}", "schedule.train_iters=4",
                                     f"checkpoint.save={tmp_path / 'run'}"], check=False))
    assert str(shard) in line and "data_prep build" in line
