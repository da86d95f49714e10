"""From a config and the requested GPUs to a validated Layout and its Plan (shared by the CLI and the sweep)."""

from __future__ import annotations

import argparse
import math

from pretrain.plan.hardware import GIB

RECOMPUTE = {"none": ["model.recompute_granularity=null", "model.recompute_method=null",
                      "model.recompute_num_layers=null"],
             "selective": ["model.recompute_granularity=selective", "model.recompute_method=null",
                           "model.recompute_num_layers=null"],
             # Megatron's usual full recompute: every layer, one at a time
             "full": ["model.recompute_granularity=full", "model.recompute_method=uniform",
                      "model.recompute_num_layers=1"]}
PRECISION = {"bf16": ["model.bf16=true", "model.fp8=null"], "fp8": ["model.bf16=true", "model.fp8=hybrid"],
             "fp32": ["model.bf16=false", "model.fp8=null"]}


def overrides(args: argparse.Namespace) -> list[str]:
    """`--set` strings of the plan's layout flags (--tp, --micro-batch, --recompute, ...), after the user's."""
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
    if config.schedule.micro_batch_size == "auto":  # the trainer resolves it at start-up (pretrain.plan.micro_batch)
        raise ValueError("schedule.micro_batch_size=auto: plan a number with --micro-batch N; the trainer logs the "
                         "value auto takes at start-up")
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
    config.parallel.check_context_parallel(config.model)
    dataclasses.replace(config.parallel, context_parallel_size=1).check_model(config.model)


def plan_for(config, args: argparse.Namespace):
    """Validate `config` on the requested GPUs and build its plan."""
    from pretrain.plan.estimate import build_plan

    _check_model(config)
    layout = layout_for(config, args.nodes, args.gpus_per_node, args.dp)
    return build_plan(config, layout, args.gpu, mfu=args.mfu, allowance=int(args.allowance_gib * GIB))
