"""What a real training step allocates on this machine's CPU, to check the plan against.

Private reaches (each needed because no public API exposes the number):
- `DistributedDataParallel.buffers[i].grad_data`: Megatron DDP's contiguous gradient buffer.
- `Float16OptimizerWithFloat16Params.fp32_from_float16_groups`: the fp32 main params of 16-bit weights.
- `ChainedOptimizer.chained_optimizers`: the optimizers Megatron chains (one per param-dtype group).
- `torch.profiler.profile.profiler.function_events`: the allocation events in time order (the
  profiler's public tables aggregate them and lose the order a peak needs).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from megatron_ext.model import ModelConfig, ParallelConfig


# The ops of SDPA's math path (the model's losses use log_softmax, a different op).
MATH_ATTENTION_OPS = frozenset({"aten::_softmax", "aten::_safe_softmax"})


@dataclass
class Measured:
    """Bytes found in a real Megatron step on CPU."""

    weights: int
    grads: int
    optimizer: int
    activation_peak: int  # forward + backward of one micro-batch, above what was allocated before it
    # SDPA fell back to its math path (an L x L softmax; torch 2.6 on CPU does, 2.13 runs a fused kernel there): the
    # plan models flash attention, as the GPUs it plans for run, so the activation peak is not comparable then
    attention_materialised: bool = False


def _storage_bytes(tensors) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        if torch.is_tensor(t):
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def _optimizers(optimizer) -> list:
    return list(getattr(optimizer, "chained_optimizers", [optimizer]))


def state_of(engine) -> tuple[int, int, int]:
    """(weight, gradient-buffer, optimizer-state) bytes actually allocated by a built engine."""
    params = [p for chunk in engine.chunks for p in chunk.module.parameters()]
    grads = [buffer.grad_data for chunk in engine.chunks for buffer in chunk.buffers]
    state = []
    for opt in _optimizers(engine.optimizer):
        for group in getattr(opt, "fp32_from_float16_groups", []):
            state.extend(group)
        for values in opt.optimizer.state.values():
            state.extend(values.values())
    return _storage_bytes(params), _storage_bytes(grads), _storage_bytes(state)


def _peak_before_optimizer(prof) -> int:
    events = sorted(prof.profiler.function_events, key=lambda e: e.time_range.start)
    stop = min((e.time_range.start for e in events if e.name.startswith("Optimizer.step")), default=None)
    level = peak = 0
    for event in events:
        if stop is not None and event.time_range.start >= stop:
            break
        # self usage: what the op itself allocated minus what it freed, children excluded, so each
        # byte is counted once; "[memory]" events are allocations and frees outside any op.
        level += event.cpu_memory_usage if event.name == "[memory]" else event.self_cpu_memory_usage
        peak = max(peak, level)
    return peak


def measure_step(model: ModelConfig, micro_batch: int, seed: int = 0) -> Measured:
    """Build the model and optimizer as the trainer does, run two steps, profile the second."""
    from megatron_ext.positions import PositionConfig, build_sampler
    from pretrain.trainer.config import OptimizerSettings
    from pretrain.trainer.engine import Engine

    from pretrain.plan.params import _ensure_world

    _ensure_world()
    engine = Engine(model, ParallelConfig(), OptimizerSettings(), 10)
    sampler = build_sampler(PositionConfig(), seed=seed, train_seq_len=model.seq_length,
                            num_layers=model.num_layers, rotary_dim=model.rotary_dim,
                            rotary_base=model.rotary_base, total_steps=10)
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, model.vocab_size, (micro_batch, model.seq_length + 1), generator=generator)
    batch = {"tokens": tokens[:, :-1], "labels": tokens[:, 1:],
             "loss_mask": torch.ones(micro_batch, model.seq_length)}
    engine.train_step(iter([batch]), sampler, 0, 1, micro_batch, model.seq_length)  # Adam state now exists
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        engine.train_step(iter([batch]), sampler, 1, 1, micro_batch, model.seq_length)
    weights, grads, optimizer = state_of(engine)
    materialised = any(event.name in MATH_ATTENTION_OPS for event in prof.profiler.function_events)
    return Measured(weights, grads, optimizer, _peak_before_optimizer(prof), materialised)
