"""Training-step time of each position strategy, per_step vs per_sample granularity, one process.

    .venv/bin/python benchmarks/bench_step_time.py [--preset cpu-small] [--steps 12] [--seq 256]

The paper reports +0.1–0.4 % wall-clock for PosAug. Steps of all configurations are interleaved
round-robin so drift in machine load hits every one alike; the median is reported, with the
positions-only cost (`PositionSampler.training` for one step's microbatches) next to it. per_sample
draws one generator per sequence and gives [b, s] positions (unfused RoPE on GPUs; CPU has no
fused path, so this measures the draws and the per-sample angles only).
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from megatron_ext.model import ParallelConfig  # noqa: E402
from pretrain.table import model_preset  # noqa: E402
from megatron_ext.positions import PositionConfig, build_sampler  # noqa: E402
from pretrain.trainer import distributed  # noqa: E402
from pretrain.trainer.config import OptimizerSettings  # noqa: E402
from pretrain.trainer.engine import Engine  # noqa: E402

GRANULARITIES = ("per_step", "per_sample")
STRATEGIES = {
    "none": {},
    "posaug": {"strategy": "posaug"},
    "posaug independent layers": {"strategy": "posaug", "layer_mode": "independent"},
    "random_base": {"strategy": "random_base"},
    "rfs": {"strategy": "rfs", "max_position": 8192},
    "rpe": {"strategy": "rpe", "max_position": 8192},
    "warp": {"strategy": "warp"},
}


def positions_seconds(sampler, step: int, num_microbatches: int, micro_batch: int, seq: int) -> float:
    """Wall seconds to build one step's positions (every microbatch of the global batch)."""
    start = time.perf_counter()
    for m in range(num_microbatches):
        sampler.training(step, seq, first_sample=m * micro_batch, batch_size=micro_batch)
    return time.perf_counter() - start


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
        for granularity in GRANULARITIES[:1] if name == "none" else GRANULARITIES:
            key = (name, granularity)
            samplers[key] = build_sampler(PositionConfig(**fields, granularity=granularity), seed=0,
                                          train_seq_len=args.seq, num_layers=model.num_layers,
                                          rotary_dim=model.rotary_dim, rotary_base=model.rotary_base,
                                          total_steps=args.steps + 2)
            torch.manual_seed(0)
            engines[key] = Engine(model, ParallelConfig(), OptimizerSettings(), args.steps,
                                  per_sample_positions=samplers[key].needs_per_sample)
    tokens = torch.randint(0, model.vocab_size, (args.micro_batch, args.seq + 1))
    batch = {"tokens": tokens[:, :-1], "labels": tokens[:, 1:], "loss_mask": torch.ones(args.micro_batch, args.seq)}
    times = {key: [] for key in engines}
    position_times = {key: [] for key in engines}
    for step in range(args.steps + 2):
        for key, engine in engines.items():
            start = time.perf_counter()
            engine.train_step(iter([batch]), samplers[key], step, 1, args.micro_batch, args.seq)
            if step >= 2:  # warm-up
                times[key].append(time.perf_counter() - start)
                position_times[key].append(positions_seconds(samplers[key], step, 1, args.micro_batch, args.seq))
    base = statistics.median(times[("none", "per_step")])
    print(f"model {args.preset}: {model.non_embedding_parameters() / 1e6:.2f}M non-embedding params, "
          f"seq {args.seq}, micro-batch {args.micro_batch}, {args.steps} steps per configuration (median), "
          f"{torch.get_num_threads()} threads")
    print(f"{'strategy':<28}{'granularity':<12}{'s/step':>9}{'vs none':>9}{'positions ms':>14}"
          f"{'sample/step':>13}")
    for (name, granularity), values in times.items():
        median = statistics.median(values)
        per_step = statistics.median(times.get((name, "per_step"), values))
        positions_ms = statistics.median(position_times[(name, granularity)]) * 1e3
        ratio = f"{median / per_step:>12.3f}x" if granularity == "per_sample" else f"{'':>13}"
        print(f"{name:<28}{granularity:<12}{median:>9.4f}{median / base:>8.3f}x{positions_ms:>14.3f}{ratio}")
    distributed.destroy()


if __name__ == "__main__":
    main()
