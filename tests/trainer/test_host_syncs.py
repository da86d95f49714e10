"""A training step reads the device once (the skip decision): the loss, gradient norm and skip reason stay on the
device until the loop reads them, and the gradient norm that replaces Megatron's fallback clips the same."""

import importlib.util

import pytest
import torch

from conftest import REPO, run_torchrun
from pretrain.trainer import optimizer_step
from pretrain.trainer.host_syncs import HostSyncCounter


def _parallel_step():
    spec = importlib.util.spec_from_file_location("parallel_step", REPO / "tests/distributed/parallel_step.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PS = _parallel_step()


def engine_and_sampler(clip_grad: float = 0.5, strategy: str = "posaug", bf16: bool = False):
    from pretrain.trainer import distributed

    model = PS.model_preset("tiny", bf16=bf16)
    sampler = PS.build_sampler(PS.PositionConfig(strategy=strategy), seed=PS.SEED, train_seq_len=model.seq_length,
                               num_layers=model.num_layers, rotary_dim=model.rotary_dim,
                               rotary_base=model.rotary_base, total_steps=4)
    distributed.seed_all(PS.SEED)
    engine = PS.Engine(model, PS.ParallelConfig(), PS.OptimizerSettings(lr=1e-3, min_lr=1e-3, clip_grad=clip_grad,
                                                                        lr_decay_style="constant"), train_iters=4)
    return model, engine, sampler


def run_step(model, engine, sampler, step: int, micro_batch_size: int = 1):
    data = PS.rank_microbatches(model, step, 0, PS.GLOBAL_BATCH, micro_batch_size)
    return engine.train_step(iter(data), sampler, step, len(data), micro_batch_size, model.seq_length)


@pytest.mark.parametrize("strategy, bf16", [("posaug", False), ("rfs", False), ("none", True)],
                         ids=["posaug", "rfs-per-sample", "bf16"])
def test_a_training_step_makes_one_device_sync(megatron_world, strategy, bf16):
    model, engine, sampler = engine_and_sampler(strategy=strategy, bf16=bf16)
    run_step(model, engine, sampler, 0)  # the first step builds the optimizer state
    with HostSyncCounter() as counter:
        result = run_step(model, engine, sampler, 1)
    assert counter.count == 1, counter.sites
    assert result.update_successful


def test_reading_the_loss_and_gradient_norm_is_what_syncs(megatron_world):
    model, engine, sampler = engine_and_sampler()
    result = run_step(model, engine, sampler, 0)
    with HostSyncCounter() as counter:
        values = (result.loss, result.grad_norm, result.skip_reason)
    assert counter.count == 2 and values[2] is None and all(v > 0 for v in values[:2])


def test_a_non_finite_loss_skips_the_update_naming_its_microbatch(megatron_world, monkeypatch):
    model, engine, sampler = engine_and_sampler()
    before = [p.detach().clone() for p in engine.model.module.parameters()]
    real = engine.model.module.forward
    calls = []

    def third_microbatch_nan(*args, **kwargs):
        calls.append(1)
        output = real(*args, **kwargs)
        return output * float("nan") if len(calls) == 3 else output

    monkeypatch.setattr(engine.model.module, "forward", third_microbatch_nan)
    result = run_step(model, engine, sampler, 0)
    assert not result.update_successful
    assert result.skip_reason == "non-finite loss in microbatch 3/4"
    for old, new in zip(before, engine.model.module.parameters()):
        assert torch.equal(old, new)


def test_non_finite_gradients_with_finite_losses_skip_the_update(megatron_world):
    model, engine, sampler = engine_and_sampler()
    param = next(engine.model.module.parameters())
    param.register_hook(lambda grad: grad * float("inf"))
    result = run_step(model, engine, sampler, 0)
    assert not result.update_successful
    assert result.skip_reason == "non-finite gradients (every microbatch's loss is finite)"
    assert result.grad_norm != result.grad_norm or result.grad_norm == float("inf")


def megatron_step(optimizer, loss, bad_loss):
    """Megatron's own optimizer.step() (its fallback gradient norm without TE/Apex), as the reference."""
    updated, grad_norm, _ = optimizer.step()
    norm = torch.tensor(float("nan") if grad_norm is None else grad_norm, dtype=torch.float64)
    return optimizer_step.StepOutcome(loss, bad_loss, norm, skipped=not updated)


@pytest.mark.parametrize("clip_grad", [0.05, 100.0], ids=["clipped", "unclipped"])
def test_gradient_norm_and_clipping_match_megatrons_step(megatron_world, monkeypatch, clip_grad):
    runs = []
    for reference in (False, True):
        if reference:
            monkeypatch.setattr(optimizer_step, "step", megatron_step)
        model, engine, sampler = engine_and_sampler(clip_grad=clip_grad)
        norms = [run_step(model, engine, sampler, step).grad_norm for step in range(2)]
        runs.append((norms, [p.detach().clone() for p in engine.model.module.parameters()]))
    (norms, params), (reference_norms, reference_params) = runs
    assert norms == pytest.approx(reference_norms, rel=1e-6, abs=0)
    for mine, theirs in zip(params, reference_params):
        # fp32 rounding of the clip coefficient (float64 sum of squares here, fp32 norm of norms in Megatron)
        torch.testing.assert_close(mine, theirs, rtol=1e-6, atol=1e-7)


@pytest.mark.slow
@pytest.mark.parametrize("nproc, layout", [(2, ["--tp", "2"]), (2, ["--pp", "2"]), (2, ["--distributed-optimizer"])],
                         ids=["tp2", "pp2", "dp2-distributed-optimizer"])
def test_each_rank_makes_one_device_sync_per_step_in_a_parallel_layout(nproc, layout):
    records = run_torchrun("tests/distributed/host_syncs_step.py", nproc, *layout)
    assert len(records) == nproc
    for record in records:
        assert record["updated"] and record["syncs"] == [1, 1], record


def test_fused_adamw_trains_like_foreach_and_reads_no_step_counters(megatron_world):
    runs = []
    for fused in (False, True):
        model, engine, sampler = engine_and_sampler()
        if fused:
            optimizer_step.use_fused_adam(engine.optimizer)
        losses = [run_step(model, engine, sampler, 0).loss]
        with HostSyncCounter() as counter:
            result = run_step(model, engine, sampler, 1)
        losses.append(result.loss)
        losses += [run_step(model, engine, sampler, step).loss for step in (2, 3)]
        runs.append((losses, counter))
    (foreach_losses, foreach_counter), (fused_losses, fused_counter) = runs
    assert fused_losses == pytest.approx(foreach_losses, rel=1e-5)  # same update, another kernel's rounding
    # α's CPU draw per microbatch only: the fused step reads no per-param step counter, foreach reads one each
    assert fused_counter.count == 1 and fused_counter.host_reads == PS.GLOBAL_BATCH < foreach_counter.host_reads
