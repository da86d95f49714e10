"""`python -m pretrain plan CONFIG`: memory per GPU, step time and cost of a run before it starts."""

from __future__ import annotations

import argparse
import json
import math
import sys

from pretrain.cli import Parser, add_config, add_set, config_of
from pretrain.plan.budget import BUDGETS, budget_override
from pretrain.plan.hardware import CONTEXT_ALLOWANCE_BYTES, DEFAULT_GPU, GIB, GPUS
from pretrain.plan.layout import PRECISION, RECOMPUTE, overrides, plan_for


def parser() -> argparse.ArgumentParser:
    """The plan command's arguments."""
    p = Parser(prog="python -m pretrain plan", description=__doc__.split("\n")[0].split(": ", 1)[1])
    add_config(p)
    add_set(p, help="config override, as for train")
    p.add_argument("--gpu", default=DEFAULT_GPU, choices=sorted(GPUS), help="GPU model to plan memory and cost for")
    p.add_argument("--nodes", type=int, help="nodes (default: 1, or what --dp and the layout need)")
    p.add_argument("--gpus-per-node", type=int, help="GPUs per node (default: 8)")
    p.add_argument("--tp", "--tensor-model-parallel-size", dest="tp", type=int,
                   help="parallel.tensor_model_parallel_size (default: the config's)")
    p.add_argument("--pp", "--pipeline-model-parallel-size", dest="pp", type=int,
                   help="parallel.pipeline_model_parallel_size (default: the config's)")
    p.add_argument("--dp", type=int, help="data-parallel size (with --nodes: checked against the GPUs)")
    p.add_argument("--micro-batch", type=int, help="schedule.micro_batch_size")
    p.add_argument("--recompute", choices=sorted(RECOMPUTE), help="full = uniform, one layer at a time")
    p.add_argument("--sequence-parallel", action=argparse.BooleanOptionalAction, default=None,
                   help="parallel.sequence_parallel (default: the config's)")
    p.add_argument("--distributed-optimizer", action=argparse.BooleanOptionalAction, default=None,
                   help="parallel.use_distributed_optimizer (default: the config's)")
    p.add_argument("--precision", choices=sorted(PRECISION), help="training precision (default: the config's)")
    p.add_argument("--mfu", type=float, help="model FLOPs utilisation to assume (default: the GPU's published one)")
    p.add_argument("--allowance-gib", type=float, default=CONTEXT_ALLOWANCE_BYTES / GIB,
                   help="GiB per GPU for the CUDA context, workspaces and NCCL buffers")
    p.add_argument("--slurm-time", help="the job's time limit (SLURM format): warn when the run needs longer")
    p.add_argument("--usr1-lead", type=int, default=0, help="seconds before --slurm-time the job saves (#SBATCH --signal)")
    p.add_argument("--budget", choices=sorted(BUDGETS), help="token budget of a Table 1 size: "
                   + "; ".join(f"{k} = {v}" for k, v in BUDGETS.items()) + " (default: the config's train_tokens)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument("--check", action="store_true", help="exit 2 with a one-line reason when the peak does not fit")
    p.add_argument("--sweep", action="store_true", help="every size x method of table.py: GPU-hours per run and total")
    return p


def _time_warning(plan, slurm_time: str, lead: int) -> str | None:
    from pretrain.plan.report import duration, parse_slurm_time

    limit = parse_slurm_time(slurm_time)
    usable = max(limit - lead, 1)
    if plan.wall_seconds <= usable:
        return None
    jobs = math.ceil(plan.wall_seconds / usable)
    return (f"WARNING: predicted wall clock {duration(plan.wall_seconds)} exceeds the job's --time {slurm_time} "
            f"(less {lead} s to save): the run relies on requeue, about {jobs} jobs of {slurm_time}; "
            "raise --time or use more nodes to finish in one")


def run(argv: list[str]) -> int:
    """Parse, plan, print; the exit code (0, or 2 for bad input / --check that does not fit)."""
    args = parser().parse_args(argv)
    from pretrain.plan.report import one_line_refusal, render
    from pretrain.trainer import config as train_config

    if args.mfu is not None and not 0 < args.mfu <= 1:
        raise ValueError(f"--mfu {args.mfu}: expected a fraction in (0, 1], e.g. --mfu 0.3")
    if args.slurm_time is not None:
        from pretrain.plan.report import parse_slurm_time

        parse_slurm_time(args.slurm_time)
    if args.sweep:
        from pretrain.plan.sweep import sweep

        print(sweep(args))
        return 0
    path = config_of(args)
    if not path:
        raise ValueError("plan needs a CONFIG (a YAML file or a shipped name such as 113m_posaug), or --sweep")
    config = train_config.load(path, overrides(args))
    if args.budget:
        config = train_config.load(path, [*budget_override(config.preset or "", args.budget), *overrides(args)])
    plan = plan_for(config, args)
    warning = _time_warning(plan, args.slurm_time, args.usr1_lead) if args.slurm_time else None
    if args.json:
        print(json.dumps({**plan.to_json(), "time_warning": warning}, indent=2, default=str))
    else:
        print(render(plan))
        if warning:
            print(warning)
    if args.check and not plan.fits:
        print(f"plan: {one_line_refusal(plan)}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str]) -> int:
    """Entry point of `python -m pretrain plan`: bad input is one line and exit code 2."""
    try:
        return run(argv)
    except (ValueError, RuntimeError) as error:
        print(f"plan: {error}", file=sys.stderr)
        return 2
