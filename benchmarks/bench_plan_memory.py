"""`pretrain plan` against what a real Megatron step allocates on this CPU.

    .venv/bin/python benchmarks/bench_plan_memory.py [--sizes 10m 42m 113m] [--seq 128] [--micro-batch 2]

For each size and precision (fp32, bf16; local layers, as on CPU) it builds the model and Megatron's
optimizer exactly as the trainer does, runs two steps, and compares
- weights, the DDP gradient buffer and the optimizer state (fp32 main params, Adam moments, step
  counters) with the plan's bytes: these must match to the byte;
- the activation peak of the second step's forward + backward, from the PyTorch profiler's
  allocation events (pretrain/plan/measure.py), with the plan's activations + logits/loss + backward
  temporaries: the ratio measured / planned is printed (tests/plan asserts it within 10 % at the tiny size).
The GPU comparison (torch.cuda.max_memory_allocated, step time, MFU of 42m/113m) needs a GPU and is
not part of this script's CPU run.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pretrain.plan.layout import layout_for  # noqa: E402
from pretrain.plan.estimate import build_plan  # noqa: E402
from pretrain.plan.measure import measure_step  # noqa: E402
from pretrain.trainer.config import from_dict  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["10m", "42m", "113m"])
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--micro-batch", type=int, default=2)
    args = parser.parse_args()
    print(f"seq {args.seq}, micro-batch {args.micro_batch}, vocabulary of the shipped configs (50257 -> 50304), "
          "local layers on CPU; bytes in MiB")
    print(f"{'size':<6}{'dtype':<6}{'weights':>10}{'grads':>10}{'optimizer':>11}{'state exact':>13}"
          f"{'act plan':>10}{'act meas':>10}{'meas/plan':>11}")
    worst = 0.0
    for size in args.sizes:
        for bf16 in (False, True):
            config = from_dict({"preset": size, "model": {"seq_length": args.seq, "bf16": bf16,
                                                          "transformer_impl": "local"},
                                "schedule": {"micro_batch_size": args.micro_batch,
                                             "global_batch_size": args.micro_batch, "train_iters": 10}})
            stage = build_plan(config, layout_for(config, 1, 1, None), "h100-80gb").stages[0]
            measured = measure_step(config.model, args.micro_batch)
            exact = (stage.weights, stage.grads, stage.optimizer) == (measured.weights, measured.grads,
                                                                      measured.optimizer)
            planned = stage.activations + stage.logits + stage.backward_temporaries
            ratio = measured.activation_peak / planned
            worst = max(worst, abs(ratio - 1))
            mib = 2**20
            print(f"{size:<6}{'bf16' if bf16 else 'fp32':<6}{measured.weights / mib:>10.2f}{measured.grads / mib:>10.2f}"
                  f"{measured.optimizer / mib:>11.2f}{'yes' if exact else 'NO':>13}{planned / mib:>10.2f}"
                  f"{measured.activation_peak / mib:>10.2f}{ratio:>11.3f}", flush=True)
    print(f"largest activation deviation: {worst:.1%}")
    print("GPU comparison (peak from torch.cuda.max_memory_allocated, step time, MFU): not run, no GPU here")


if __name__ == "__main__":
    main()
