"""One or more real training steps under torchrun with a given TP/PP layout; prints JSON per step.

Used by tests/trainer/test_parallel_equivalence.py: the same microbatches, weights and positions
under TP=2, PP=2 (1F1B) or DP=2 must give one process's loss and gradient norm.
"""

import argparse
import json

import torch
import torch.distributed as dist

from megatron_ext.model import ParallelConfig
from pretrain.experiments.table import model_preset
from megatron_ext.positions import PositionConfig, build_sampler
from pretrain.trainer import distributed
from pretrain.trainer.config import OptimizerSettings
from pretrain.trainer.engine import Engine

GLOBAL_MICROBATCHES, MICRO_BATCH, SEED = 4, 2, 1234


def microbatches(model, count, offset):
    """Deterministic token microbatches, independent of the layout."""
    out = []
    for index in range(offset, offset + count):
        g = torch.Generator().manual_seed(1000 + index)
        tokens = torch.randint(0, model.vocab_size, (MICRO_BATCH, model.seq_length + 1), generator=g)
        out.append({"tokens": tokens[:, :-1], "labels": tokens[:, 1:],
                    "loss_mask": torch.ones(MICRO_BATCH, model.seq_length)})
    return out


def full_model_state(model):
    """Weights of the PP=1 model for this seed, to load stage by stage (PP changes init order)."""
    from megatron.core import parallel_state
    from megatron_ext.model import build_model

    distributed.initialize(ParallelConfig(), SEED)
    state = {k: v.clone() for k, v in build_model(model).state_dict().items() if torch.is_tensor(v)}
    parallel_state.destroy_model_parallel()
    return state


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--pp", type=int, default=1)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--strategy", default="posaug")
    parser.add_argument("--alpha", type=float, default=0.37)
    parser.add_argument("--distributed-optimizer", action="store_true")
    args = parser.parse_args()
    model = model_preset("tiny")
    parallel = ParallelConfig(tensor_model_parallel_size=args.tp, pipeline_model_parallel_size=args.pp,
                              sequence_parallel=args.tp > 1,
                              use_distributed_optimizer=args.distributed_optimizer)
    reference_state = full_model_state(model) if args.pp > 1 else None
    distributed.initialize(parallel, SEED)
    from megatron.core import parallel_state

    positions = PositionConfig(strategy=args.strategy, alpha_distribution="fixed", alpha_fixed=args.alpha) \
        if args.strategy == "posaug" else PositionConfig(strategy=args.strategy)
    sampler = build_sampler(positions, seed=SEED, train_seq_len=model.seq_length, num_layers=model.num_layers,
                            rotary_dim=model.rotary_dim, rotary_base=model.rotary_base, total_steps=args.steps)
    engine = Engine(model, parallel, OptimizerSettings(lr=1e-3, min_lr=1e-3, lr_decay_style="constant",
                                                       clip_grad=0.0), train_iters=args.steps)
    if reference_state is not None:
        first_layer = parallel_state.get_pipeline_model_parallel_rank() * (model.num_layers // args.pp)
        module = engine.model.module
        local = {}
        for name in module.state_dict():
            if not torch.is_tensor(module.state_dict()[name]):
                continue
            global_name = name
            if name.startswith("decoder.layers."):
                parts = name.split(".")
                parts[2] = str(int(parts[2]) + first_layer)
                global_name = ".".join(parts)
            if global_name == "output_layer.weight" and global_name not in reference_state:
                global_name = "embedding.word_embeddings.weight"  # tied: last stage's copy
            if global_name in reference_state:
                local[name] = reference_state[global_name]
        module.load_state_dict(local, strict=False)
        # DDP keeps grads in its own buffers; params were loaded in place, so nothing else to sync.
    dp_rank, dp_size = distributed.data_parallel_info()
    per_rank = GLOBAL_MICROBATCHES // dp_size
    for step in range(args.steps):
        data = microbatches(model, per_rank, offset=step * GLOBAL_MICROBATCHES + dp_rank * per_rank)
        result = engine.train_step(iter(data), sampler, step, per_rank, MICRO_BATCH, model.seq_length)
        if dist.get_rank() == 0:
            print("RESULT " + json.dumps({"step": step, "loss": result.loss, "grad_norm": result.grad_norm}),
                  flush=True)
    distributed.destroy()


if __name__ == "__main__":
    main()
