"""Every reader of a checkpoint verifies the sha256 checksums the trainer verifies at resume (one resolution
function: pretrain/trainer/run_dir.resolve). Three bytes flipped in a shard of the newest checkpoint (size kept):
given the run directory, export-hf and eval run fall back to the newest intact checkpoint and say so in one line;
given the damaged iter_* directory, or a run with no intact checkpoint, each refuses in one line naming the file
(exit 2). Real `python -m pretrain` processes on a tiny real-text run."""

import os
import shutil
import subprocess
import sys

import pytest

import conftest
from conftest import REPO, TINY_TRAIN, run_train

SHARD = "__0_0.distcp"
SKIPPED = f"skipping the damaged iter_0000004 ({SHARD} does not match its sha256 checksum); using "


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_shards):
    """Four steps of the tiny preset on real text, checkpoints at 2 and 4."""
    run_dir = tmp_path_factory.mktemp("readers") / "run"
    run_train([*TINY_TRAIN, f"data.data_path={tiny_shards}", "schedule.train_iters=4", "checkpoint.save_interval=2",
               "checkpoint.keep_last=5", f"checkpoint.save={run_dir}"])
    return run_dir


def flip_bytes(path, count: int = 3) -> None:
    """Invert `count` bytes in the middle of a file, its size unchanged (bit rot, not truncation)."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    for i in range(middle, middle + count):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.fixture
def rotten(trained, tmp_path):
    """A copy of the run whose newest checkpoint has 3 flipped bytes in a shard."""
    copy = tmp_path / "run"
    shutil.copytree(trained, copy)
    flip_bytes(copy / "iter_0000004" / SHARD)
    return copy


def pretrain(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="")
    return subprocess.run([sys.executable, "-m", "pretrain", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)


def export(checkpoint, out) -> subprocess.CompletedProcess:
    return pretrain("export-hf", str(checkpoint), "--output", str(out), "--no-tokenizer")


def evaluate(model, tiny_shards, out) -> subprocess.CompletedProcess:
    return pretrain("eval", "run", str(model), "--data", tiny_shards, "--lengths", "32", "--num-spans", "2",
                    "--backend", "megatron", "--output", str(out))


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    """The one stderr line of a command that refused (exit 2) without a traceback."""
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-4000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "error:" in lines[0], proc.stderr[-4000:]
    return lines[0]


def skip_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in (proc.stdout + proc.stderr).splitlines() if SKIPPED in line]


@pytest.mark.slow  # exports a model
def test_export_hf_of_the_run_falls_back_to_the_newest_intact_checkpoint_saying_so(rotten, tmp_path):
    proc = export(rotten, tmp_path / "hf")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = skip_lines(proc)
    assert len(lines) == 1 and lines[0].endswith(str(rotten / "iter_0000002")), proc.stderr[-3000:]


def test_export_hf_of_the_damaged_checkpoint_refuses_naming_the_file(rotten, tmp_path):
    line = one_error_line(export(rotten / "iter_0000004", tmp_path / "hf"))
    assert f"iter_0000004 is damaged: {SHARD} does not match its sha256 checksum" in line
    assert str(rotten / "iter_0000002") in line  # the intact one to pass instead
    assert not (tmp_path / "hf" / "model.safetensors").exists()


@pytest.mark.slow  # evaluates a model
def test_eval_run_of_the_run_falls_back_to_the_newest_intact_checkpoint_saying_so(rotten, tiny_shards, tmp_path):
    proc = evaluate(rotten, tiny_shards, tmp_path / "eval")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(skip_lines(proc)) == 1, proc.stderr[-3000:]


def test_eval_run_of_the_damaged_checkpoint_refuses_naming_the_file(rotten, tiny_shards, tmp_path):
    line = one_error_line(evaluate(rotten / "iter_0000004", tiny_shards, tmp_path / "eval"))
    assert f"iter_0000004 is damaged: {SHARD} does not match its sha256 checksum" in line


def test_a_run_without_an_intact_checkpoint_is_refused_by_export_naming_each_file(rotten, tmp_path):
    flip_bytes(rotten / "iter_0000002" / SHARD)
    line = one_error_line(export(rotten, tmp_path / "hf"))
    assert "holds no intact checkpoint" in line and f"iter_0000002 ({SHARD} does not match" in line


def test_training_from_a_damaged_checkpoint_load_refuses_naming_the_file(rotten, tiny_shards, tmp_path):
    proc = run_train([*TINY_TRAIN, f"data.data_path={tiny_shards}", "schedule.train_iters=4",
                      f"checkpoint.load={rotten / 'iter_0000004'}", f"checkpoint.save={tmp_path / 'tuned'}"],
                     check=False)
    assert f"{SHARD} does not match its sha256 checksum" in conftest.one_error_line(proc)
