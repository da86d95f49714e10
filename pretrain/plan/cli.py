"""`python -m pretrain plan CONFIG`: memory per GPU, step time and cost of a run before it starts."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from pretrain.plan.hardware import CONTEXT_ALLOWANCE_BYTES, DEFAULT_GPU, GIB, GPUS

RECOMPUTE = {"none": ["model.recompute_granularity=null", "model.recompute_method=null",
                      "model.recompute_num_layers=null"],
             "selective": ["model.recompute_granularity=selective", "model.recompute_method=null",
                           "model.recompute_num_layers=null"],
             # Megatron's usual full recompute: every layer, one at a time
             "full": ["model.recompute_granularity=full", "model.recompute_method=uniform",
                      "model.recompute_num_layers=1"]}
PRECISION = {"bf16": ["model.bf16=true", "model.fp8=null"], "fp8": ["model.bf16=true", "model.fp8=hybrid"],
             "fp32": ["model.bf16=false", "model.fp8=null"]}


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


def _overrides(args: argparse.Namespace) -> list[str]:
    sets = list(args.set)
    if args.tp is not None:
        sets.append(f"parallel.tensor_model_parallel_size={args.tp}")
    if args.pp is not None:
        sets.append(f"parallel.pipeline_model_parallel_size={args.pp}")
    if args.micro_batch is not None:
        sets.append(f"schedule.micro_batch_size={args.micro_batch}")
    if args.recompute is not None:
        sets += RECOMPUTE[args.recompute]
    if args.sequence_parallel is not None:
        sets.append(f"parallel.sequence_parallel={str(args.sequence_parallel).lower()}")
    if args.distributed_optimizer is not None:
        sets.append(f"parallel.use_distributed_optimizer={str(args.distributed_optimizer).lower()}")
    if args.precision is not None:
        sets += PRECISION[args.precision]
    return sets


def _default_gpus(config) -> tuple[int, int]:
    """(nodes, GPUs per node) of the size's launcher, or one GPU for a model outside the table."""
    from pretrain.table import SIZES

    size = SIZES.get(config.preset or "")
    if size is not None and size.slurm is not None:
        return size.slurm.nodes, size.slurm.gpus_per_node
    return 1, 1


def layout_for(config, nodes: int | None, gpus_per_node: int | None, dp: int | None):
    """The Layout of `config` on the given GPUs; ValueError naming the setting when it cannot run."""
    from pretrain.plan.estimate import Layout

    par = config.parallel
    model_parallel = par.tensor_model_parallel_size * par.pipeline_model_parallel_size * par.context_parallel_size
    if nodes is None and gpus_per_node is None and dp is not None:
        world = model_parallel * dp
        gpus_per_node = min(world, 8)
        nodes = math.ceil(world / gpus_per_node)
    else:
        default_nodes, default_gpus = _default_gpus(config)
        nodes = default_nodes if nodes is None else nodes
        gpus_per_node = default_gpus if gpus_per_node is None else gpus_per_node
        world = nodes * gpus_per_node
    if nodes < 1 or gpus_per_node < 1:
        raise ValueError("--nodes and --gpus-per-node must be >= 1")
    derived = par.data_parallel_size(world)
    if dp is not None and dp != derived:
        raise ValueError(f"--dp {dp} but {world} GPUs / (TP x PP x CP = {model_parallel}) = {derived}: "
                         "change --nodes/--gpus-per-node, --tp or --pp")
    micro = config.schedule.micro_batch_size * derived
    if config.schedule.global_batch_size % micro:
        raise ValueError(f"schedule.global_batch_size ({config.schedule.global_batch_size}) must be divisible by "
                         f"micro-batch x DP ({config.schedule.micro_batch_size} x {derived}); change --micro-batch "
                         "or the GPU count")
    precision = "fp8" if config.model.fp8 else ("bf16" if config.model.bf16 else "fp32")
    return Layout(nodes=nodes, gpus_per_node=gpus_per_node, tp=par.tensor_model_parallel_size,
                  pp=par.pipeline_model_parallel_size, dp=derived, cp=par.context_parallel_size,
                  vp=par.virtual_pipeline_model_parallel_size, micro_batch=config.schedule.micro_batch_size,
                  microbatches=config.schedule.global_batch_size // micro,
                  sequence_parallel=par.sequence_parallel, distributed_optimizer=par.use_distributed_optimizer,
                  precision=precision)


def _check_model(config) -> None:
    import dataclasses

    # Context parallelism is planned (sequence split) even on a machine without a GPU.
    dataclasses.replace(config.parallel, context_parallel_size=1).check_model(config.model)


def plan_for(config, args: argparse.Namespace):
    """Validate `config` on the requested GPUs and build its plan."""
    from pretrain.plan.estimate import build_plan

    _check_model(config)
    layout = layout_for(config, args.nodes, args.gpus_per_node, args.dp)
    return build_plan(config, layout, args.gpu, mfu=args.mfu, allowance=int(args.allowance_gib * GIB))


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
    config = train_config.load(_config_path(args.config), _overrides(args))
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
