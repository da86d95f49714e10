"""The optimizer step with one host read: loss, non-finite check and gradient norm stay on the device.

Megatron's `optimizer.step()` without Transformer Engine or Apex computes the gradient norm with its
fallback `local_multi_tensor_l2_norm` (megatron/core/utils.py: a Python float per parameter, then
`float(norm)`; clip_grads.py: `.item()` on the reduced norm) and compares the clip coefficient on the host.
Here the step is Megatron's own parts in Megatron's order (prepare_grads, clip by the total norm,
step_with_ready_grads), with the norm from `torch._foreach_norm` kept on the device: the clip coefficient
is applied as a device scalar clamped to 1 (a multiply by 1.0 is exact, so an unclipped step matches
Megatron's skipped scaling bit for bit), and one `bool()` of "norm or loss not finite" decides the skip.
No collective runs in a group of one process.

Reaches into Megatron-Core (checked against megatron-core 0.16.1 and 0.19.2; megatron_ext.versions REACHES
"optimizer_step_parts" names the first, looked up when the engine is built, and selfcheck's step proves it):
- MegatronOptimizer.prepare_grads / step_with_ready_grads (public methods, but `step()` is the documented
  entry): `step()` = prepare_grads, clip_grad_norm, count_zeros (off here), step_with_ready_grads in
  optimizer.py (FP32Optimizer, MixedPrecisionOptimizer, DistributedOptimizer, ChainedOptimizer alike).
- get_grads_for_grad_norm (megatron-core 0.19; get_main_grads_for_grad_norm in 0.16.1-0.18, the first one found is
  called) / get_grad_stats_parallel_group / get_parameters: the gradients Megatron's norm
  reads (shared and TP-duplicate params left out) and the group it sums over (model-parallel, or the world
  with the distributed optimizer).
- ChainedOptimizer.chained_optimizers: the optimizers inside a chain (a lone optimizer is its own chain).
- The inner torch optimizer's param_groups["fused"/"foreach"] (torch 2.13): set after Megatron built a torch
  AdamW (megatron/core/optimizer/__init__.py builds torch.optim.AdamW/Adam without TE/Apex and passes no
  `fused`), read by torch at each step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist


def training_device() -> torch.device:
    """Where this rank's model and its step tensors live."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def chained(optimizer) -> list:
    """The optimizers inside Megatron's ChainedOptimizer (a lone optimizer is its own chain)."""
    return list(getattr(optimizer, "chained_optimizers", [optimizer]))


def _group_size(group) -> int:
    return dist.get_world_size(group) if dist.is_initialized() else 1


def _grads_for_norm(part) -> list:
    """The gradients Megatron's own norm reads (the method was renamed in megatron-core 0.19)."""
    getter = getattr(part, "get_grads_for_grad_norm", None) or part.get_main_grads_for_grad_norm
    return getter()


def grad_norm_squared(optimizer) -> torch.Tensor:
    """Collective over the grad-stats group (none in a group of one): Σ‖g‖² of Megatron's norm grads, float64."""
    parts = chained(optimizer)
    groups = {id(part.get_grad_stats_parallel_group()) for part in parts}
    if len(groups) != 1:  # Megatron's per-optimizer path (expert-parallel MoE), which no model here builds
        raise NotImplementedError("optimizers with different gradient-statistics groups are not supported")
    grads = [grad for part in parts for grad in _grads_for_norm(part)]
    device = training_device()
    if grads:
        norms = torch._foreach_norm(grads, 2.0)  # one multi-tensor kernel per device and dtype
        # float64: the sum of squares of finite float32 norms cannot overflow it
        total = torch.stack([n.to(device=device, dtype=torch.float64) for n in norms]).square().sum()
    else:
        total = torch.zeros((), dtype=torch.float64, device=device)
    group = parts[0].get_grad_stats_parallel_group()
    if _group_size(group) > 1:
        total = total.reshape(1)
        dist.all_reduce(total, group=group)
        total = total.reshape(())
    return total


def clip_by_total_norm(optimizer, total_norm: torch.Tensor) -> None:
    """Scale every clipped optimizer's grads by min(1, clip_grad / (norm + 1e-6)) (Megatron's rule), on the device."""
    for part in chained(optimizer):
        if getattr(part, "is_stub_optimizer", False) or part.config.clip_grad <= 0.0:
            continue
        if getattr(part.config, "use_precision_aware_optimizer_no_fp8_or_ds_fp8", False):
            raise NotImplementedError("decoupled grads (precision-aware optimizer) are not supported")
        grads = [param.grad for param in part.get_parameters() if param.grad is not None]
        if grads:
            coefficient = (part.config.clip_grad / (total_norm + 1.0e-6)).clamp(max=1.0)
            torch._foreach_mul_(grads, coefficient.to(dtype=grads[0].dtype))


@dataclass
class StepOutcome:
    """The device side of one optimizer step; host values are read only when asked for."""

    loss: torch.Tensor  # mean over microbatches and DP ranks, float64, 0-dim
    bad_loss: torch.Tensor  # [num_microbatches] 1.0 where that microbatch's loss was non-finite
    grad_norm: torch.Tensor  # float64, 0-dim (NaN when skipped before the norm)
    skipped: bool
    overflow: bool = False  # skipped by the fp16 grad scaler's own inf/NaN check


def reduce_losses(losses: list[dict], num_microbatches: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean loss on the last stage averaged over DP, non-finite flag per microbatch), on every rank, on the device.

    One all-reduce over the world when it has more than one process (ranks off the last stage add zeros)."""
    from megatron.core import parallel_state

    device = training_device()
    buffer = torch.zeros(1 + num_microbatches, dtype=torch.float64, device=device)
    if parallel_state.is_pipeline_last_stage() and losses:
        # records arrive in microbatch order (schedules append them so), so the flag's index is the microbatch
        values = torch.stack([record["lm loss"].detach().reshape(-1).to(device=device, dtype=torch.float64)
                              for record in losses])
        # every TP and CP rank of the last stage holds the same loss: count it once per DP rank
        replicas = (parallel_state.get_data_parallel_world_size()
                    * parallel_state.get_tensor_model_parallel_world_size()
                    * parallel_state.get_context_parallel_world_size())
        buffer[0] = values.sum() / values.shape[0] / values.shape[1] / replicas
        buffer[1:1 + len(losses)] = (~torch.isfinite(values).all(dim=1)).to(torch.float64)
    if _group_size(None) > 1:
        dist.all_reduce(buffer)
    return buffer[0], buffer[1:]


def check_reaches() -> None:
    """MissingReachError (one line) when the installed Megatron lacks the step's parts."""
    from megatron_ext.versions import resolve

    resolve("optimizer_step_parts")


def step(optimizer, loss: torch.Tensor, bad_loss: torch.Tensor) -> StepOutcome:
    """Megatron's optimizer.step() with one host read: skip when a loss or the gradient norm is not finite."""
    if optimizer.prepare_grads():  # True only with an fp16 grad scaler, which reads its own flag
        nan = torch.full((), math.nan, dtype=torch.float64, device=loss.device)
        return StepOutcome(loss, bad_loss, nan, skipped=True, overflow=True)
    total = grad_norm_squared(optimizer)
    norm = total.sqrt()
    skip = ~torch.isfinite(total) | (bad_loss.sum() > 0)
    if bool(skip):  # the step's one device→host sync
        return StepOutcome(loss, bad_loss, norm, skipped=True)
    clip_by_total_norm(optimizer, norm)
    optimizer.step_with_ready_grads()
    return StepOutcome(loss, bad_loss, norm, skipped=False)


def use_fused_adam(optimizer) -> int:
    """Make each inner torch Adam/AdamW fused (one kernel for all params); returns how many were switched."""
    switched = 0
    for part in chained(optimizer):
        inner = getattr(part, "optimizer", None)
        if not isinstance(inner, (torch.optim.Adam, torch.optim.AdamW)):
            continue  # TE's or Apex's FusedAdam is fused already
        inner.defaults.update(fused=True, foreach=False)
        for group in inner.param_groups:
            group.update(fused=True, foreach=False)
        for state in inner.state.values():  # a fused step keeps its step count on the param's device
            if "step" in state:
                state["step"] = state["step"].to(dtype=torch.float32, device=training_device())
        switched += 1
    return switched
