"""`python -m pretrain plan CONFIG`: memory per GPU, step time and cost of a run before it starts."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from pretrain.plan.hardware import CONTEXT_ALLOWANCE_BYTES, DEFAULT_GPU, GIB, GPUS
from pretrain.plan.layout import PRECISION, RECOMPUTE, overrides, plan_for


def parser() -> argparse.ArgumentParser:
    """The plan command's arguments."""
    p = argparse.ArgumentParser(prog="python -m pretrain plan", description=__doc__.split("\n")[0].split(": ", 1)[1])
    p.add_argument("config", nargs="?", help="YAML config, or a shipped name such as 113m_posaug")
    p.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE", help="config overrides, as for train")
    p.add_argument("--gpu", default=DEFAULT_GPU, choices=sorted(GPUS))
    p.add_argument("--nodes", type=int)
    p.add_argument("--gpus-per-node", type=int)
    p.add_argument("--tp", type=int, help="parallel.tensor_model_parallel_size")
    p.add_argument("--pp", type=int, help="parallel.pipeline_model_parallel_size")
    p.add_argument("--dp", type=int, help="data-parallel size (with --nodes: checked against the GPUs)")
    p.add_argument("--micro-batch", type=int, help="schedule.micro_batch_size")
    p.add_argument("--recompute", choices=sorted(RECOMPUTE), help="full = uniform, one layer at a time")
    p.add_argument("--sequence-parallel", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--distributed-optimizer", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--precision", choices=sorted(PRECISION))
    p.add_argument("--mfu", type=float, help="model FLOPs utilisation to assume (default: the GPU's published one)")
    p.add_argument("--allowance-gib", type=float, default=CONTEXT_ALLOWANCE_BYTES / GIB,
                   help="CUDA context, workspaces and NCCL buffers per GPU (default 2)")
    p.add_argument("--slurm-time", help="the job's time limit (SLURM format): warn when the run needs longer")
    p.add_argument("--usr1-lead", type=int, default=0, help="seconds before the limit the job saves (#SBATCH --signal)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument("--check", action="store_true", help="exit 2 with a one-line reason when the peak does not fit")
    p.add_argument("--sweep", action="store_true", help="every size x method of table.py: GPU-hours per run and total")
    return p


def _config_path(name: str) -> str:
    from pretrain.trainer.config import CONFIG_DIR

    path = Path(name)
    if not path.is_file() and (CONFIG_DIR / f"{name}.yaml").is_file():
        return str(CONFIG_DIR / f"{name}.yaml")
    return name


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
    from pretrain.plan.report import one_line_refusal, render
    from pretrain.trainer import config as train_config

    args = parser().parse_args(argv)
    if args.mfu is not None and not 0 < args.mfu <= 1:
        raise ValueError(f"--mfu {args.mfu}: expected a fraction in (0, 1], e.g. --mfu 0.3")
    if args.slurm_time is not None:
        from pretrain.plan.report import parse_slurm_time

        parse_slurm_time(args.slurm_time)
    if args.sweep:
        from pretrain.plan.sweep import sweep

        print(sweep(args))
        return 0
    if not args.config:
        raise ValueError("plan needs a CONFIG (a YAML file or a shipped name such as 113m_posaug), or --sweep")
    config = train_config.load(_config_path(args.config), overrides(args))
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
