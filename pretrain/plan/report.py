"""Text rendering of a plan, the sweep table, and the durations SLURM's --time uses."""

from __future__ import annotations

import re

from megatron_ext.model_config import FLOP_CONVENTION
from pretrain.plan.estimate import Plan
from pretrain.plan.hardware import GIB


def gib(n: float) -> str:
    """Bytes as GiB with two decimals (MiB below 0.1 GiB)."""
    return f"{n / GIB:8.2f} GiB" if abs(n) >= 0.1 * GIB else f"{n / 2**20:8.2f} MiB"


def duration(seconds: float) -> str:
    """Seconds as D-HH:MM:SS (SLURM's format), or MM:SS under an hour."""
    s = int(round(seconds))
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{s:02d}"
    return f"{hours:02d}:{minutes:02d}:{s:02d}"


def parse_slurm_time(text: str) -> int:
    """SLURM --time (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS) in seconds; ValueError otherwise."""
    match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text.strip())
    if not match:
        raise ValueError(f"--slurm-time {text!r}: expected SLURM's format, e.g. 48:00:00 or 2-00:00:00")
    days, a, b, c = match.groups()
    parts = [int(x) for x in (a, b, c) if x is not None]
    if days is not None:  # D-HH[:MM[:SS]]
        hours, minutes, seconds = (parts + [0, 0])[:3]
        return int(days) * 86400 + hours * 3600 + minutes * 60 + seconds
    if len(parts) == 1:
        return parts[0] * 60
    if len(parts) == 2:
        return parts[0] * 60 + parts[1]
    return parts[0] * 3600 + parts[1] * 60 + parts[2]


def render(plan: Plan) -> str:
    """The plan as one table."""
    lay = plan.layout
    worst = plan.worst
    rows = [f"plan: {plan.name} on {lay.world} x {plan.gpu_label} ({lay.nodes} node(s) x {lay.gpus_per_node} GPUs)",
            f"  layout           TP {lay.tp} / PP {lay.pp}{f' x VP {lay.vp}' if lay.vp else ''} / DP {lay.dp}"
            f"{f' / CP {lay.cp}' if lay.cp > 1 else ''}, micro-batch {lay.micro_batch} x {lay.microbatches} "
            f"micro-batches, {lay.precision}, sequence parallel {'on' if lay.sequence_parallel else 'off'}, "
            f"distributed optimizer {'on' if lay.distributed_optimizer else 'off'}",
            "parameters (Megatron GPTModel built on the meta device)",
            f"  total            {plan.total_params:>15,}",
            f"  embedding        {plan.embedding_params:>15,}  (tied: one copy{' + output copy on the last stage' if lay.pp > 1 else ''})",
            f"  non-embedding    {plan.non_embedding_params:>15,}"]
    for s in plan.stages:
        rows.append(f"  per GPU, stage {s.stage:<2}{s.params:>15,}")
    head = "".join(f"{'stage ' + str(s.stage):>15}" for s in plan.stages)
    rows.append(f"bytes per GPU {head}")
    parts = [("weights", "weights"), ("gradients (fp32)", "grads"), ("optimizer state", "optimizer"),
             ("activations", "activations"), ("logits + loss", "logits"), ("backward temporaries", "backward_temporaries"),
             ("fragmentation 5%", "fragmentation"), ("CUDA ctx/NCCL", "allowance")]
    for label, key in parts:
        rows.append(f"  {label:<21}" + "".join(f"{gib(getattr(s, key)):>15}" for s in plan.stages))
    rows.append("  " + "-" * (21 + 15 * len(plan.stages)))
    rows.append(f"  {'peak':<21}" + "".join(f"{gib(s.peak):>15}" for s in plan.stages))
    verdict = "fits" if plan.fits else "DOES NOT FIT"
    rows.append(f"  GPU memory {plan.gpu_memory / 1e9:g} GB = {gib(plan.gpu_memory).strip()} (datasheet), "
                f"headroom {gib(plan.headroom).strip()} "
                f"(stage {worst.stage}): {verdict}")
    flights = ", ".join(f"stage {s.stage}: {s.in_flight:g}" for s in plan.stages)
    rows.append(f"  activations: {flights} micro-batch(es) in flight (1F1B)")
    rows += ["compute",
             f"  FLOPs per token  {plan.flops_per_token:.4g}, {FLOP_CONVENTION}",
             f"  tokens           {plan.tokens:,} ({plan.iterations:,} steps x {plan.tokens_per_step:,} tokens)",
             f"  assumed MFU      {100 * plan.mfu:.3g}% of {plan.peak_tflops:g} TFLOP/s ({plan.mfu_source})",
             f"  step time        {plan.step_seconds:.3f} s, {plan.tokens_per_second:,.0f} tokens/s",
             f"  wall clock       {duration(plan.wall_seconds)} ({plan.wall_seconds / 3600:.2f} h)",
             f"  GPU-hours        {plan.gpu_hours:,.1f}"]
    rows += [f"note: {n}" for n in plan.notes]
    return "\n".join(rows)


def advice(plan: Plan) -> str:
    """Which setting to change when the plan does not fit (the largest component decides)."""
    worst = plan.worst
    dynamic = worst.activations + worst.logits
    static = worst.weights + worst.grads + worst.optimizer
    lay = plan.layout
    if dynamic >= static:
        if lay.micro_batch > 1:
            return f"lower --micro-batch (schedule.micro_batch_size={lay.micro_batch // 2}) or recompute (--recompute full)"
        return "recompute (--recompute selective/full), raise --tp with --sequence-parallel, or --pp"
    if not lay.distributed_optimizer and lay.dp > 1:
        return "use --distributed-optimizer (parallel.use_distributed_optimizer=true) or raise --tp/--pp"
    return "raise --tp or --pp (parallel.tensor/pipeline_model_parallel_size), or use more nodes"


def one_line_refusal(plan: Plan) -> str:
    """The single line --check prints when the plan does not fit."""
    return (f"{plan.name}: predicted peak {gib(plan.worst.peak).strip()} on stage {plan.worst.stage} exceeds the "
            f"{gib(plan.gpu_memory).strip()} of a {plan.gpu} by {gib(-plan.headroom).strip()}: {advice(plan)}")
