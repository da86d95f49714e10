"""A divergence cannot cost every good checkpoint: pruning keeps the newest checkpoint saved before the first
skipped update (or loss spike) beside the keep_last newest ones, and `python -m pretrain runs` names it.
A real run with optimizer.lr=1e4, a checkpoint every step and keep_last=2: its updates start being skipped after
several saves and it stops after 3 in a row."""

import os
import re
import subprocess
import sys
from collections import deque

import pytest

from conftest import REPO, TINY_TRAIN, run_train
from pretrain.trainer.health import SPIKE_MIN_STEPS, is_spike


@pytest.fixture(scope="module")
def diverged(tmp_path_factory):
    """(run dir, first skipped step) of a tiny run that diverges at lr 1e4."""
    run_dir = tmp_path_factory.mktemp("diverged") / "run"
    proc = run_train([*TINY_TRAIN, "data.synthetic=true", "optimizer.lr=1e4", "optimizer.min_lr=0",
                      "optimizer.lr_warmup_iters=0", "schedule.train_iters=12", "checkpoint.save_interval=1",
                      "checkpoint.keep_last=2", "logging.eval_interval=100", f"checkpoint.save={run_dir}"], check=False)
    assert proc.returncode == 1 and "consecutive skipped updates" in proc.stderr, proc.stderr[-3000:]
    first = int(re.search(r"step (\d+)/12: update skipped \(1 of", proc.stdout).group(1))
    assert first >= 3, proc.stdout  # several saves before the divergence
    return run_dir, first


def test_the_checkpoint_before_the_first_skipped_update_survives_pruning(diverged):
    run_dir, first = diverged
    kept = sorted(p.name for p in run_dir.glob("iter_*"))
    assert f"iter_{first - 1:07d}" in kept, kept
    assert len(kept) == 3, kept  # keep_last=2 newest, and the healthy one beside them


def test_runs_names_the_last_healthy_checkpoint(diverged):
    run_dir, first = diverged
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "pretrain", "runs", str(run_dir)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    expected = f"last healthy checkpoint: iter_{first - 1:07d} (before the update skipped at step {first})"
    assert expected in proc.stdout, proc.stdout + proc.stderr


def test_a_loss_far_above_the_recent_mean_is_a_spike():
    recent = deque([3.0] * SPIKE_MIN_STEPS)
    assert is_spike(6.5, recent) and is_spike(float("nan"), recent)
    assert not is_spike(3.5, recent)
    assert not is_spike(100.0, deque([3.0] * (SPIKE_MIN_STEPS - 1)))  # too few steps seen to call one


def test_a_step_whose_loss_was_not_read_is_neither_judged_nor_counted(tmp_path):
    """The loop reads the loss only at log steps and skips (one host sync per step): other steps pass None."""
    from pretrain.trainer.health import Health

    health = Health(tmp_path)
    for done in range(1, SPIKE_MIN_STEPS + 1):
        health.step(done, 1.0, True)
    health.step(SPIKE_MIN_STEPS + 1, None, True)
    assert len(health.recent) == SPIKE_MIN_STEPS and health.healthy
    assert not list(tmp_path.iterdir())  # no trouble recorded
