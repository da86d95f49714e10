"""The trainer end to end: data_prep shards, parallel layouts, resume, signals, TensorBoard."""

import os
import signal
import subprocess
import sys

import pytest

from conftest import REPO, TINY_TRAIN, run_train, tensorboard_scalars, wait_for_step, wait_group_gone

pytestmark = [pytest.mark.slow]  # training subprocesses, torchrun layouts


def test_tiny_model_trains_on_data_prep_shards_and_loss_decreases(tiny_shards, tmp_path):
    run_train([*TINY_TRAIN, f"data.data_path={tiny_shards}", "schedule.train_iters=30",
               "positions.strategy=posaug", f"checkpoint.save={tmp_path}", "checkpoint.save_interval=100"])
    losses = tensorboard_scalars(tmp_path, "train/loss")
    assert sorted(losses) == list(range(1, 31))
    first, last = sum(losses[s] for s in (1, 2, 3)) / 3, sum(losses[s] for s in (28, 29, 30)) / 3
    assert last < first - 0.5, (first, last)
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "30"


def test_tensorboard_events_hold_the_named_scalars(tiny_shards, tmp_path):
    run_train([*TINY_TRAIN, f"data.data_path={tiny_shards}", "schedule.train_iters=4", "positions.strategy=posaug",
               f"checkpoint.save={tmp_path}"])
    for tag in ("train/loss", "train/lr", "train/grad_norm", "positions/alpha", "positions/max_position",
                "positions/min_gap", "perf/tokens_per_s", "perf/step_time_s", "valid/loss"):
        assert tensorboard_scalars(tmp_path, tag), tag
    alphas = tensorboard_scalars(tmp_path, "positions/alpha")
    assert all(0.125 <= a <= 8.0 for a in alphas.values()) and len(set(alphas.values())) > 1


@pytest.fixture(scope="module")
def reference_run(tiny_shards, tmp_path_factory):
    """Six steps in one process, checkpoint after step 2: the curve the other layouts must follow."""
    run_dir = tmp_path_factory.mktemp("reference")
    run_train([*TINY_TRAIN, f"data.data_path={tiny_shards}", "schedule.train_iters=6", "positions.strategy=posaug",
               f"checkpoint.save={run_dir}", "checkpoint.save_interval=2", "checkpoint.keep_last=5"])
    return run_dir


@pytest.mark.parametrize("layout", [
    ["parallel.tensor_model_parallel_size=2", "parallel.sequence_parallel=true"],
    ["parallel.pipeline_model_parallel_size=2"],
    [],  # DP=2
], ids=["tp2", "pp2", "dp2"])
def test_parallel_layout_resumed_from_one_process_checkpoint_follows_the_same_loss_curve(
        reference_run, tiny_shards, tmp_path, layout):
    import shutil

    shutil.copytree(reference_run / "iter_0000002", tmp_path / "iter_0000002")
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("2")
    run_train([*TINY_TRAIN, f"data.data_path={tiny_shards}", "schedule.train_iters=6", "positions.strategy=posaug",
               f"checkpoint.save={tmp_path}", "checkpoint.save_interval=100", *layout], nproc=2)
    expected, got = tensorboard_scalars(reference_run, "train/loss"), tensorboard_scalars(tmp_path, "train/loss")
    for step in (3, 4, 5, 6):
        assert got[step] == pytest.approx(expected[step], abs=1e-5), step
    expected_norm, got_norm = (tensorboard_scalars(reference_run, "train/grad_norm"),
                               tensorboard_scalars(tmp_path, "train/grad_norm"))
    assert got_norm[6] == pytest.approx(expected_norm[6], abs=1e-5)


def _start(overrides):
    env = dict(os.environ, PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="")
    return subprocess.Popen([sys.executable, "-m", "pretrain", "train", "--set", *overrides], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def test_kill_9_then_restart_continues_the_loss_curve_exactly(reference_run, tiny_shards, tmp_path):
    overrides = [*TINY_TRAIN, f"data.data_path={tiny_shards}", "schedule.train_iters=6", "positions.strategy=posaug",
                 f"checkpoint.save={tmp_path}", "checkpoint.save_interval=2", "checkpoint.keep_last=5"]
    proc = _start(overrides)
    wait_for_step(proc, 5)  # the checkpoint of step 4 is complete once step 5 is logged
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert wait_group_gone(proc.pid) == [], "a checkpoint helper outlived the killed trainer"
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() in ("4", "5")
    resumed = run_train(overrides)
    assert "resumed from iteration" in resumed.stdout
    expected, got = tensorboard_scalars(reference_run, "train/loss"), tensorboard_scalars(tmp_path, "train/loss")
    for step in range(1, 7):
        assert got[step] == expected[step], step


def test_sigterm_saves_a_checkpoint_and_exits_with_the_requeue_code(tiny_shards, tmp_path):
    from pretrain.trainer.config import REQUEUE_EXIT_CODE

    proc = _start([*TINY_TRAIN, f"data.data_path={tiny_shards}", "schedule.train_iters=10000",
                   f"checkpoint.save={tmp_path}", "checkpoint.save_interval=100000"])
    wait_for_step(proc, 3)
    os.killpg(proc.pid, signal.SIGTERM)  # as SLURM and a shell deliver it: to every process of the job
    output = proc.communicate(timeout=120)[0]
    assert proc.returncode == REQUEUE_EXIT_CODE, output[-2000:]
    saved = int((tmp_path / "latest_checkpointed_iteration.txt").read_text())
    assert saved >= 3 and f"saved iteration {saved}" in output
