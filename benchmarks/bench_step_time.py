"""Training-step time of each position strategy relative to `none`, same model, one process.

    .venv/bin/python benchmarks/bench_step_time.py [--preset cpu-small] [--steps 12] [--seq 256]

The paper reports +0.1–0.4 % wall-clock for PosAug. Steps of all strategies are interleaved
round-robin so drift in machine load hits every strategy alike; the median is reported.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from megatron_ext.model import ParallelConfig  # noqa: E402
from pretrain.experiments.table import model_preset  # noqa: E402
from megatron_ext.positions import PositionConfig, build_sampler  # noqa: E402
from pretrain.trainer import distributed  # noqa: E402
from pretrain.trainer.config import OptimizerSettings  # noqa: E402
from pretrain.trainer.engine import Engine  # noqa: E402

STRATEGIES = {
    "none": {},
    "posaug": {"strategy": "posaug"},
    "posaug independent layers": {"strategy": "posaug", "layer_mode": "independent"},
    "random_base": {"strategy": "random_base"},
    "rfs": {"strategy": "rfs", "max_position": 8192},
    "rfs per sample": {"strategy": "rfs", "max_position": 8192, "per_sample": True},
    "rpe": {"strategy": "rpe", "max_position": 8192},
    "warp": {"strategy": "warp"},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="cpu-small")
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()
    distributed.initialize(ParallelConfig(), seed=0)
    model = model_preset(args.preset, seq_length=args.seq)
    engines, samplers = {}, {}
    for name, fields in STRATEGIES.items():
        samplers[name] = build_sampler(PositionConfig(**fields), seed=0, train_seq_len=args.seq,
                                       num_layers=model.num_layers, rotary_dim=model.rotary_dim,
                                       rotary_base=model.rotary_base, total_steps=args.steps)
        torch.manual_seed(0)
        engines[name] = Engine(model, ParallelConfig(), OptimizerSettings(), args.steps,
                               per_sample_positions=samplers[name].needs_per_sample)
    tokens = torch.randint(0, model.vocab_size, (args.micro_batch, args.seq + 1))
    batch = {"tokens": tokens[:, :-1], "labels": tokens[:, 1:], "loss_mask": torch.ones(args.micro_batch, args.seq)}
    times = {name: [] for name in STRATEGIES}
    for step in range(args.steps + 2):
        for name, engine in engines.items():
            start = time.perf_counter()
            engine.train_step(iter([batch]), samplers[name], step, 1, args.micro_batch, args.seq)
            if step >= 2:  # warm-up
                times[name].append(time.perf_counter() - start)
    base = statistics.median(times["none"])
    print(f"model {args.preset}: {model.non_embedding_parameters() / 1e6:.2f}M non-embedding params, "
          f"seq {args.seq}, micro-batch {args.micro_batch}, {args.steps} steps per strategy (median)")
    print(f"{'strategy':<28}{'s/step':>10}{'vs none':>10}")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:<28}{median:>10.4f}{median / base:>9.3f}x")
    distributed.destroy()


if __name__ == "__main__":
    main()
