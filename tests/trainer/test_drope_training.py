"""DroPE through the trainer: the switch inside one run (its budget the baseline's, no RoPE after it, the learning-rate
restart), resume across the switch and mid-recalibration bitwise, and the recalibration run from checkpoint.load."""

import shutil

import pytest

from conftest import TINY_TRAIN, run_train, tensorboard_scalars

pytestmark = [pytest.mark.slow]  # training subprocesses

# 8 steps, the last 2 without RoPE (0.25 x 8): the switch is step index 6, logged as step 7.
STEPS, SHARE, SWITCH = 8, 0.25, 6
DROPE = [*TINY_TRAIN, f"schedule.train_iters={STEPS}", "positions.strategy=drope", f"positions.drope_share={SHARE}"]


@pytest.fixture(scope="module")
def drope_run(tiny_shards, tmp_path_factory):
    """Eight steps in one process, a checkpoint after every step."""
    run_dir = tmp_path_factory.mktemp("drope")
    run = run_train([*DROPE, f"data.data_path={tiny_shards}", f"checkpoint.save={run_dir}",
                     "checkpoint.save_interval=1", "checkpoint.keep_last=10"])
    assert "DroPE: steps 1-6 with RoPE (none), steps 7-8 without RoPE" in run.stdout
    return run_dir


def test_the_run_trains_the_baselines_steps_and_drops_rope_from_the_switch_on(drope_run):
    assert sorted(tensorboard_scalars(drope_run, "train/loss")) == list(range(1, STEPS + 1))  # the budget's steps
    largest = tensorboard_scalars(drope_run, "positions/max_position")
    assert [largest[step] for step in range(1, SWITCH + 1)] == [31.0] * SWITCH  # RoPE at 0..w-1
    assert [largest[step] for step in range(SWITCH + 1, STEPS + 1)] == [0.0] * (STEPS - SWITCH)  # every angle 0


def test_the_learning_rate_schedule_restarts_at_the_switch(drope_run):
    lr = tensorboard_scalars(drope_run, "train/lr")  # the rate set for the next step
    assert lr[SWITCH] < 3e-3 / 2  # the run's cosine near its end
    assert lr[SWITCH + 1] == pytest.approx(3e-3)  # one warmup step (2 x 2 / 8) back to the peak
    assert lr[STEPS] == pytest.approx(3e-4)  # and down to the minimum at the run's end


@pytest.mark.parametrize("resume_after", [SWITCH - 1, SWITCH + 1], ids=["across-the-switch", "mid-recalibration"])
def test_a_resumed_run_follows_the_uninterrupted_one_bitwise(drope_run, tiny_shards, tmp_path, resume_after):
    name = f"iter_{resume_after:07d}"
    shutil.copytree(drope_run / name, tmp_path / name)
    (tmp_path / "latest_checkpointed_iteration.txt").write_text(str(resume_after))
    resumed = run_train([*DROPE, f"data.data_path={tiny_shards}", f"checkpoint.save={tmp_path}",
                         "checkpoint.save_interval=100"])
    assert "resumed from iteration" in resumed.stdout
    for tag in ("train/loss", "train/lr", "train/grad_norm"):
        expected, got = tensorboard_scalars(drope_run, tag), tensorboard_scalars(tmp_path, tag)
        assert [got[step] for step in range(resume_after + 1, STEPS + 1)] == \
               [expected[step] for step in range(resume_after + 1, STEPS + 1)], tag


def test_a_recalibration_run_from_a_rope_checkpoint_trains_every_step_without_rope(drope_run, tiny_shards, tmp_path):
    source = drope_run / f"iter_{SWITCH:07d}"  # still a RoPE model: the last pretraining step
    run = run_train([*TINY_TRAIN, "schedule.train_iters=3", "positions.strategy=drope", "positions.drope_share=1",
                     f"data.data_path={tiny_shards}", f"checkpoint.load={source}", f"checkpoint.save={tmp_path}"])
    assert "initialised weights from" in run.stdout and "DroPE: every step without RoPE" in run.stdout
    assert set(tensorboard_scalars(tmp_path, "positions/max_position").values()) == {0.0}
    lr = tensorboard_scalars(tmp_path, "train/lr")
    assert [lr[1], lr[2]] == pytest.approx([1.5e-3, 3e-3])  # a fresh schedule: the run's 2 warmup steps
