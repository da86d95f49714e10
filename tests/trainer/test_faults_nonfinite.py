"""Non-finite steps: the update is skipped on the step itself, a run of them stops the run naming the
1-based step and the loss scale, and no checkpoint ever holds NaN/inf weights.

The run is real: optimizer.lr=1e30 makes step 1's update huge but finite and step 2's gradients NaN
(loss still finite), the failure Megatron's fp32 optimizer applies without looking. ~15 s CPU.
"""

import math

import pytest
import torch

from conftest import TINY_TRAIN, run_train

DIVERGING = [*TINY_TRAIN, "data.synthetic=true", "optimizer.lr=1e30", "optimizer.min_lr=0",
             "optimizer.lr_warmup_iters=0", "schedule.train_iters=6", "checkpoint.save_interval=1",
             "checkpoint.keep_last=10", "optimizer.max_consecutive_skipped_iters=2"]


@pytest.fixture(scope="module")
def diverged(tmp_path_factory):
    """(run dir, CompletedProcess) of the diverging run."""
    run_dir = tmp_path_factory.mktemp("diverged")
    return run_dir, run_train([*DIVERGING, f"checkpoint.save={run_dir}"], check=False)


def test_non_finite_update_is_skipped_on_its_own_step(diverged):
    _, proc = diverged
    assert "step 2/6: update skipped (1 of at most 2 in a row): non-finite gradients" in proc.stdout


def test_consecutive_skipped_updates_stop_the_run_naming_step_and_loss_scale(diverged):
    _, proc = diverged
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1
    assert "stopped at step 3/6 after 2 consecutive skipped updates" in errors[0]
    assert "loss scale 1" in errors[0] and "optimizer.lr" in errors[0]


def test_no_checkpoint_of_a_diverged_run_holds_non_finite_weights(megatron_world, diverged):
    from megatron_ext.model import ParallelConfig, build_model
    from pretrain.trainer import checkpoint
    from pretrain.trainer import config as config_module

    run_dir, _ = diverged
    saved = sorted(run_dir.glob("iter_*"))
    assert [p.name for p in saved] == ["iter_0000001", "iter_0000002"]  # step 2 skipped: step 1's weights
    config = config_module.from_dict(checkpoint.read_train_state(saved[0])["config"])
    for path in saved:
        model = build_model(config.model, ParallelConfig())
        checkpoint.load_model_weights(path, model)
        assert all(torch.isfinite(p).all() for p in model.parameters()), path


def test_save_refuses_non_finite_weights_and_writes_nothing(megatron_world, tmp_path):
    from pretrain.trainer import checkpoint
    from pretrain.trainer import config as config_module
    from pretrain.trainer.engine import Engine

    config = config_module.load(None, [*TINY_TRAIN, "schedule.train_iters=4"])
    engine = Engine(config.model, config.parallel, config.optimizer, 4)
    with torch.no_grad():
        next(engine.model.parameters()).view(-1)[0] = math.inf
    with pytest.raises(checkpoint.NonFiniteWeightsError, match="iteration 3"):
        checkpoint.save(tmp_path, 3, engine, {}, keep_last=1)
    assert list(tmp_path.iterdir()) == []
