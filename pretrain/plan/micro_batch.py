"""The planner behind `schedule.micro_batch_size: auto` (registered with the trainer at import).

Tries the micro-batches that divide global_batch_size / DP from the largest down and takes the first whose
planned peak (build_plan's worst stage, the number `pretrain plan` prints) fits the memory given. Peak bytes do
not depend on the GPU model, only time does, so any table entry serves for the estimate.
"""

from __future__ import annotations

import copy

from pretrain.trainer.micro_batch import register_micro_batch_planner

_ESTIMATE_GPU = "h200"  # bytes only: the GPU entry sets time and the FP8 check, not the peak


def largest_fitting(config, world_size: int, memory_bytes: int) -> tuple[int, float]:
    """(largest micro-batch whose planned peak fits `memory_bytes`, that peak); ValueError when even 1 does not."""
    from pretrain.plan.estimate import build_plan
    from pretrain.plan.layout import layout_for

    par = config.parallel
    dp = par.data_parallel_size(world_size)
    gbs = config.schedule.global_batch_size
    if gbs % dp:
        raise ValueError(f"schedule.micro_batch_size=auto: schedule.global_batch_size ({gbs}) must be divisible "
                         f"by DP ({dp})")
    per_rank = gbs // dp
    candidates = [m for m in range(per_rank, 0, -1) if per_rank % m == 0
                  and (par.virtual_pipeline_model_parallel_size is None
                       or (per_rank // m) % par.pipeline_model_parallel_size == 0)]
    smallest = None
    with _planning_world():
        for micro_batch in candidates:
            trial = copy.deepcopy(config)
            trial.schedule.micro_batch_size = micro_batch
            plan = build_plan(trial, layout_for(trial, None, None, dp), _ESTIMATE_GPU)
            if plan.worst.peak <= memory_bytes:
                return micro_batch, plan.worst.peak
            smallest = plan.worst.peak
    raise ValueError(f"schedule.micro_batch_size=auto: even a micro-batch of 1 is planned at "
                     f"{(smallest or 0) / 2**30:.2f} GiB per rank, over the {memory_bytes / 2**30:.1f} GiB here; "
                     "add recompute (model.recompute_granularity), TP/PP, or GPUs with more memory "
                     "(`python -m pretrain plan` shows each part)")


class _planning_world:
    """The planner's one-process world (pretrain.plan.params builds shapes in one), gone again afterwards so the
    trainer can make its own; a world that already exists is left alone."""

    def __enter__(self):
        import torch.distributed as dist

        self.owned = not dist.is_initialized()
        return self

    def __exit__(self, *exc):
        if self.owned:
            import torch.distributed as dist
            from megatron.core import parallel_state

            if parallel_state.model_parallel_is_initialized():
                parallel_state.destroy_model_parallel()
            if dist.is_initialized():
                dist.destroy_process_group()
        return False


register_micro_batch_planner(largest_fitting)
