"""Damaged run directories: resume trusts intact iter_* dirs over the marker, refuses what it cannot use
with one line (exit 2), never replaces another run's checkpoints, locks the run directory, never unpickles.

Real `python -m pretrain train` runs of the tiny preset on synthetic tokens: the exit-2 cases ~5 s CPU each
(they stop before the model is built), the resuming ones (marked slow) ~10 s; the shared fixture run ~10 s.
"""

import json
import os
import pickle
import shutil
import socket
import subprocess
import sys
import time

import pytest
import torch

from conftest import REPO, TINY_TRAIN, one_error_line, run_train

RUN = [*TINY_TRAIN, "data.synthetic=true", "checkpoint.save_interval=2", "checkpoint.keep_last=5"]


def train(run_dir, iters=4, *extra):
    """Train (or resume) the tiny run in `run_dir` up to `iters`; the CompletedProcess, whatever its exit code."""
    return run_train([*RUN, f"schedule.train_iters={iters}", f"checkpoint.save={run_dir}", *extra], check=False)


def truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """Four steps with checkpoints at 2 and 4 (a marker naming 4)."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    run_train([*RUN, "schedule.train_iters=4", f"checkpoint.save={run_dir}"])
    return run_dir


@pytest.fixture
def run_dir(finished_run, tmp_path):
    """A private copy of the finished run, to damage."""
    copy = tmp_path / "run"
    shutil.copytree(finished_run, copy)
    return copy


@pytest.mark.slow  # resumes and trains
@pytest.mark.parametrize("marker", ["missing", "empty"])
def test_marker_is_a_hint_resume_takes_the_newest_intact_checkpoint(run_dir, marker):
    latest = run_dir / "latest_checkpointed_iteration.txt"
    latest.unlink() if marker == "missing" else latest.write_text("")
    proc = train(run_dir, 6)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resumed from iteration 4" in proc.stdout
    assert f"latest_checkpointed_iteration.txt is {marker}" in proc.stdout
    assert latest.read_text() == "6"
@pytest.mark.slow  # resumes and trains
def test_marker_naming_a_deleted_checkpoint_falls_back_to_the_newest_intact_one(run_dir):
    shutil.rmtree(run_dir / "iter_0000004")
    proc = train(run_dir, 4)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "names iteration 4; the newest intact checkpoint is 2" in proc.stdout
    assert "resumed from iteration 2" in proc.stdout
@pytest.mark.slow  # resumes and trains
def test_truncated_latest_checkpoint_falls_back_and_is_kept_aside(run_dir):
    truncate(run_dir / "iter_0000004" / "__0_0.distcp")
    proc = train(run_dir, 4)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "skipping" in proc.stdout and "iter_0000004: __0_0.distcp has" in proc.stdout
    assert "resumed from iteration 2" in proc.stdout
    assert (run_dir / "iter_0000004.damaged" / "__0_0.distcp").is_file()
    assert (run_dir / "latest_checkpointed_iteration.txt").read_text() == "4"


@pytest.mark.parametrize("damage", ["truncated file", "missing file", "garbage train_state.json"])
def test_run_dir_with_only_a_damaged_checkpoint_exits_2_naming_it_and_the_fix(run_dir, damage):
    shutil.rmtree(run_dir / "iter_0000002")
    latest = run_dir / "iter_0000004"
    if damage == "truncated file":  # the largest tensor file: megatron-core 0.16 writes two, 0.19 one
        truncate(max(latest.glob("*.distcp"), key=lambda path: path.stat().st_size))
    elif damage == "missing file":  # torch_dist's index, written by every tested megatron-core
        (latest / ".metadata").unlink()
    else:
        (latest / "train_state.json").write_text("{'iteration': 4,")
    proc = train(run_dir, 6)
    line = one_error_line(proc)
    assert "iter_0000004" in line and "checkpoint.save=" in line and "checkpoint.overwrite=true" in line
    assert latest.is_dir(), "a damaged checkpoint is kept for the user to inspect"


def test_empty_marker_without_any_checkpoint_exits_2(tmp_path):
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("")
    line = one_error_line(train(tmp_path, 4))
    assert "latest_checkpointed_iteration.txt is empty" in line and "checkpoint.save=" in line
@pytest.mark.slow  # resumes and trains
def test_overwrite_true_clears_a_run_dir_that_holds_only_damaged_checkpoints(run_dir):
    shutil.rmtree(run_dir / "iter_0000002")
    truncate(run_dir / "iter_0000004" / "__0_0.distcp")
    proc = train(run_dir, 4, "checkpoint.overwrite=true")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resumed" not in proc.stdout and "deleted the damaged checkpoints (iter_0000004)" in proc.stdout
    assert sorted(p.name for p in run_dir.glob("iter_*")) == ["iter_0000002", "iter_0000004"]
@pytest.mark.slow  # resumes and trains
def test_overwrite_true_never_deletes_an_intact_checkpoint(run_dir):
    proc = train(run_dir, 6, "checkpoint.overwrite=true")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resumed from iteration 4" in proc.stdout
@pytest.mark.slow  # a first run trains in the background
def test_second_run_on_a_locked_run_dir_exits_2_naming_the_holder(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="")
    first = subprocess.Popen([sys.executable, "-m", "pretrain", "train", "--set", *RUN, "schedule.train_iters=100000",
                              "checkpoint.save_interval=100000", f"checkpoint.save={tmp_path}"],
                             cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        deadline = time.time() + 120
        for line in first.stdout:  # the lock is taken before the first step
            if line.startswith("step 1/") or time.time() > deadline:
                break
        line = one_error_line(train(tmp_path, 4))
        assert f"PID {first.pid} on {socket.gethostname()}" in line and "checkpoint.save=" in line
    finally:
        first.kill()
        first.wait(timeout=30)


def test_eval_on_a_run_whose_only_checkpoint_is_truncated_exits_2(run_dir, tmp_path):
    shutil.rmtree(run_dir / "iter_0000002")
    truncate(run_dir / "iter_0000004" / "__0_0.distcp")
    text = tmp_path / "eval.txt"
    text.write_text("some text to score " * 50)
    env = dict(os.environ, PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-m", "pretrain", "eval", str(run_dir), "--data", str(text),
                           "--lengths", "32", "--output", str(tmp_path / "out")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    line = one_error_line(proc)
    assert "iter_0000004" in line and "__0_0.distcp" in line


def _make_legacy(checkpoint_dir, rng_state=None) -> None:
    """Turn a checkpoint into one written before completeness records, its RNG file into `rng_state`
    (default: the same streams in the old layout, random/numpy getstate() tuples)."""
    state = json.loads((checkpoint_dir / "train_state.json").read_text())
    state.pop("files", None)
    (checkpoint_dir / "train_state.json").write_text(json.dumps(state))
    rng_file = checkpoint_dir / "rng" / "rank_00000.pt"
    if rng_state is None:
        import numpy

        new = torch.load(rng_file, weights_only=True)
        py, np_ = new["python"], new["numpy"]
        rng_state = dict(new, python=(py["version"], tuple(py["state"].tolist()), py["gauss_next"]),
                         numpy=(np_["name"], np_["keys"].numpy().astype(numpy.uint32), np_["pos"],
                                np_["has_gauss"], np_["cached_gaussian"]))
        del rng_state["format"]
    torch.save(rng_state, rng_file)
@pytest.mark.slow  # resumes and trains
def test_checkpoint_from_before_completeness_records_and_tensor_rng_still_resumes(run_dir):
    _make_legacy(run_dir / "iter_0000004")
    proc = train(run_dir, 6)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resumed from iteration 4" in proc.stdout
    assert "not unpickling it" not in proc.stderr


class _Payload:
    """What a crafted checkpoint would carry: unpickling it creates a file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))
@pytest.mark.slow  # resumes and trains
def test_crafted_rng_pickle_is_never_executed(run_dir, tmp_path):
    marker = tmp_path / "pwned"
    _make_legacy(run_dir / "iter_0000004", {"torch": _Payload(marker)})
    with pytest.raises(pickle.UnpicklingError):  # the payload is live: a weights_only=False load would run it
        torch.load(run_dir / "iter_0000004" / "rng" / "rank_00000.pt", weights_only=True)
    proc = train(run_dir, 6)
    assert not marker.exists()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "not unpickling it" in proc.stderr


def test_save_never_replaces_an_existing_checkpoint(megatron_world, tmp_path):
    from pretrain.trainer import checkpoint
    from pretrain.trainer import config as config_module
    from pretrain.trainer.engine import Engine

    config = config_module.load(None, [*TINY_TRAIN, "schedule.train_iters=4"])
    engine = Engine(config.model, config.parallel, config.optimizer, 4)
    existing = tmp_path / "iter_0000003"
    existing.mkdir()
    (existing / "train_state.json").write_text('{"iteration": 3}')
    with pytest.raises(checkpoint.CheckpointError, match="checkpoint.save="):
        checkpoint.save(tmp_path, 3, engine, {}, keep_last=1)
    assert (existing / "train_state.json").read_text() == '{"iteration": 3}'


@pytest.mark.parametrize("metadata, expected", [
    ({"sharded_backend": "torch_dist", "sharded_backend_version": 1, "common_backend": "torch",
      "common_backend_version": 1}, "common.pt is missing"),  # megatron-core 0.16's layout
    ({"sharded_backend": "torch_dist", "sharded_backend_version": 1}, None),  # 0.19's: no common.pt
], ids=["megatron-core-0.16", "megatron-core-0.19"])
def test_checkpoint_without_completeness_records_needs_common_pt_only_where_its_metadata_names_it(
        tmp_path, metadata, expected):
    from pretrain.trainer.run_dir import verify

    (tmp_path / "train_state.json").write_text('{"iteration": 4}')
    (tmp_path / "metadata.json").write_text(json.dumps(metadata))
    (tmp_path / ".metadata").write_bytes(b"index")
    assert verify(tmp_path) == expected
