"""CPU time of `import megatron.core` and of a first optimizer step, with and without megatron_ext.cpu_compat's cuts.

Every process that builds a Megatron model (a training rank, an evaluation, an export) pays this import; the test
suite starts hundreds. The cuts: torch.compile deferred and wandb hidden while megatron.core imports (the import
shims), and torch.optim stepping without torch._dynamo on CPU (apply()'s patch 8). Each variant runs in a fresh
interpreter, alternated, `--repeats` times; the script prints the median user+system CPU seconds of each and the
ratios, with torch alone as the floor.

    .venv/bin/python benchmarks/bench_import_cost.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# An AdamW step on one parameter: what every training process does after importing Megatron.
_STEP = "; w = torch.nn.Parameter(torch.ones(2)); o = torch.optim.AdamW([w]); w.sum().backward(); o.step()"
VARIANTS = {
    "torch alone": "import torch",
    "megatron.core as shipped": "import torch, megatron.core",
    "megatron.core, compile deferred": "import torch, wandb, megatron_ext, megatron.core",
    "megatron.core, deferred + no wandb": "import torch, megatron_ext, megatron.core",
    "import + AdamW step, no patch 8": "import torch, megatron_ext, megatron.core" + _STEP,
    "import + AdamW step, patch 8": ("import torch, megatron_ext, megatron.core; from megatron_ext import cpu_compat; "
                                     "cpu_compat._optimizers_without_dynamo()" + _STEP),
}


def cpu_seconds(code: str) -> float:
    """User + system CPU of one fresh interpreter running `code`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=REPO, timeout=300)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    """Measure and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    samples: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(args.repeats):
        for name, code in VARIANTS.items():
            samples[name].append(cpu_seconds(code))
    medians = {name: statistics.median(values) for name, values in samples.items()}
    load = os.getloadavg()[0]
    print(f"median CPU seconds over {args.repeats} fresh interpreters each (load average {load:.1f}, "
          f"{os.cpu_count()} cores)")
    for name, median in medians.items():
        print(f"  {name:<34} {median:6.2f} s")
    shipped, deferred = medians["megatron.core as shipped"], medians["megatron.core, compile deferred"]
    no_wandb = medians["megatron.core, deferred + no wandb"]
    print(f"deferred / shipped: {deferred / shipped:.2f}x; saved per process: {shipped - deferred:.2f} CPU-s")
    print(f"wandb hidden / deferred: {no_wandb / deferred:.2f}x; saved per process: {deferred - no_wandb:.2f} CPU-s")
    unpatched, patched = medians["import + AdamW step, no patch 8"], medians["import + AdamW step, patch 8"]
    print(f"patch 8 / without: {patched / unpatched:.2f}x; saved per training process: {unpatched - patched:.2f} CPU-s")


if __name__ == "__main__":
    main()
