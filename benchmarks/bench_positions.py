"""Cost of building RoPE positions per training step, per strategy, relative to `none`.

Measures only `PositionSampler.training` (the pure-positions part; the cos/sin
computation is the same for every strategy and is left to the model-level
benchmark). Per-step cost = median per-microbatch call x microbatches per step,
reported as a ratio to the `none` strategy and as a fraction of a typical
training-step time given on the command line.

    .venv/bin/python benchmarks/bench_positions.py [--device cuda] [--step-time-ms 500]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from megatron_ext.positions import PositionConfig, build_sampler  # noqa: E402

CASES: dict[str, dict] = {
    "none": {"strategy": "none"},
    "posaug": {"strategy": "posaug"},
    "posaug log_uniform": {"strategy": "posaug", "alpha_distribution": "log_uniform"},
    "posaug top-k layers": {"strategy": "posaug", "layer_mode": "top", "layer_count": 4},
    "posaug independent": {"strategy": "posaug", "layer_mode": "independent"},
    "random_base": {"strategy": "random_base"},
    "rfs per_step": {"strategy": "rfs", "granularity": "per_step"},
    "rfs per_sample": {"strategy": "rfs", "granularity": "per_sample"},
    "rpe (L=8*s)": {"strategy": "rpe"},
    "rpe per_sample": {"strategy": "rpe", "granularity": "per_sample"},
    "warp per_step": {"strategy": "warp", "granularity": "per_step"},
    "warp per_sample": {"strategy": "warp", "granularity": "per_sample"},
}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(sampler, args, device: torch.device) -> float:
    """Median seconds of one `training` call (device work included)."""
    def call(step: int):
        first_sample = (step % args.num_microbatches) * args.micro_batch_size
        return sampler.training(step, args.seq_len, first_sample=first_sample,
                                batch_size=args.micro_batch_size, device=device)

    for step in range(args.warmup):
        call(step)
    samples = []
    for step in range(args.calls):
        sync(device)
        start = time.perf_counter()
        call(args.warmup + step)
        sync(device)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def is_sync_free(sampler, args, device: torch.device) -> str:
    """On CUDA, run one call under sync-debug 'error' mode: any host sync raises."""
    if device.type != "cuda":
        return "n/a"
    torch.cuda.set_sync_debug_mode("error")
    try:
        sampler.training(10**6, args.seq_len, first_sample=0, batch_size=args.micro_batch_size, device=device)
        return "yes"
    except RuntimeError:
        return "NO"
    finally:
        torch.cuda.set_sync_debug_mode("default")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--micro-batch-size", type=int, default=8)
    parser.add_argument("--num-microbatches", type=int, default=4, help="microbatches per optimizer step")
    parser.add_argument("--num-layers", type=int, default=24)
    parser.add_argument("--rotary-dim", type=int, default=64)
    parser.add_argument("--step-time-ms", type=float, default=500.0, help="typical training-step time")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (the dev box is shared)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)

    print(f"device={device} seq_len={args.seq_len} micro_batch={args.micro_batch_size} "
          f"microbatches/step={args.num_microbatches} layers={args.num_layers} "
          f"step_time={args.step_time_ms:.1f} ms calls={args.calls} torch={torch.__version__}")
    header = f"{'strategy':<22}{'us/call':>10}{'x none':>9}{'ms/step':>10}{'% of step':>11}{'sync-free':>11}"
    print(header)
    print("-" * len(header))
    baseline = None
    for name, fields in CASES.items():
        if fields["strategy"] == "rpe":
            fields = {**fields, "max_position": 8 * args.seq_len}
        sampler = build_sampler(PositionConfig(**fields), seed=1234, train_seq_len=args.seq_len,
                                num_layers=args.num_layers, rotary_dim=args.rotary_dim, rotary_base=10000.0,
                                total_steps=10**7)
        per_call = time_calls(sampler, args, device)
        baseline = per_call if baseline is None else baseline
        per_step_ms = per_call * args.num_microbatches * 1e3
        print(f"{name:<22}{per_call * 1e6:>10.1f}{per_call / baseline:>9.2f}{per_step_ms:>10.3f}"
              f"{100 * per_step_ms / args.step_time_ms:>10.3f}%{is_sync_free(sampler, args, device):>11}")


if __name__ == "__main__":
    main()
