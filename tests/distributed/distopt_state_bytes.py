"""Per rank, the bytes Megatron allocates for a bf16 + distributed-optimizer run after one step (torchrun, gloo).

Counted from tensors, not RSS: the model's bf16 params (views into DDP's param buffer when it has one), the
DDP gradient buffers, the optimizer's fp32 main-param shards and the torch Adam state after one step. Prints
one 'RESULT {...}' per rank with those bytes and the plan's for the same config and DP.
Used by tests/plan/test_plan_distributed_optimizer.py and benchmarks/bench_plan_distopt.py.

Private reaches (no public API exposes the numbers): `DistributedDataParallel.buffers[i].param_data` /
`.grad_data`, `DistributedOptimizer.shard_fp32_from_float16_groups`, `ChainedOptimizer.chained_optimizers`.
"""

import argparse
import json

import torch
import torch.distributed as dist

from megatron_ext.model import ParallelConfig
from megatron_ext.positions import PositionConfig, build_sampler
from pretrain.plan.estimate import build_plan
from pretrain.plan.layout import layout_for
from pretrain.plan.params import MAIN_PARAM_BYTES, stage_params
from pretrain.trainer import distributed
from pretrain.trainer.config import OptimizerSettings, from_dict
from pretrain.trainer.engine import Engine


def _storage_bytes(tensors) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        if torch.is_tensor(t):
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


def measured_bytes(engine: Engine) -> dict:
    """{weights, grads, main_params, adam} bytes this rank holds after a step."""
    params = [p for chunk in engine.chunks for p in chunk.module.parameters()]
    grads = [b.grad_data for chunk in engine.chunks for b in chunk.buffers]
    main, adam = [], []
    for opt in getattr(engine.optimizer, "chained_optimizers", [engine.optimizer]):
        for group in getattr(opt, "shard_fp32_from_float16_groups", []):
            main.extend(group)
        for values in opt.optimizer.state.values():
            adam.extend(v for v in values.values() if torch.is_tensor(v))
    return {"weights": _storage_bytes(params), "grads": _storage_bytes(grads),
            "main_params": _storage_bytes(main), "adam": _storage_bytes(adam)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=None)
    args = parser.parse_args()
    model = {"seq_length": args.seq, "bf16": True, "transformer_impl": "local"}
    if args.vocab:
        model["vocab_size"] = args.vocab
    parallel = ParallelConfig(use_distributed_optimizer=True)
    distributed.initialize(parallel, seed=1234)
    dp = dist.get_world_size()
    config = from_dict({"preset": args.preset, "model": model,
                        "parallel": {"use_distributed_optimizer": True},
                        "schedule": {"micro_batch_size": 1, "global_batch_size": dp, "train_iters": 10}})
    engine = Engine(config.model, parallel, OptimizerSettings(), 10)
    sampler = build_sampler(PositionConfig(), seed=0, train_seq_len=args.seq, num_layers=config.model.num_layers,
                            rotary_dim=config.model.rotary_dim, rotary_base=config.model.rotary_base, total_steps=10)
    g = torch.Generator().manual_seed(dist.get_rank())
    tokens = torch.randint(0, config.model.vocab_size, (1, args.seq + 1), generator=g)
    batch = {"tokens": tokens[:, :-1], "labels": tokens[:, 1:], "loss_mask": torch.ones(1, args.seq)}
    result = engine.train_step(iter([batch]), sampler, 0, 1, 1, args.seq)
    stage = build_plan(config, layout_for(config, None, None, dp), "h100-80gb").stages[0]
    # the plan sums main params and Adam state into `optimizer`; split it with the plan's own constants
    held = stage_params(config.model, 1, 1, 0)
    main_params = sum(n * MAIN_PARAM_BYTES for _, n, size in held.tensors if size < 4) / dp
    planned = {"weights": stage.weights, "grads": stage.grads, "main_params": main_params,
               "adam": stage.optimizer - main_params}
    print("RESULT " + json.dumps({"rank": dist.get_rank(), "dp": dp, "updated": result.update_successful,
                                  "measured": measured_bytes(engine), "planned": planned,
                                  "params": sum(p.numel() for p in engine.model.module.parameters())}), flush=True)
    distributed.destroy()


if __name__ == "__main__":
    main()
