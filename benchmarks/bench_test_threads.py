"""CPU and wall time of a tiny training on one OpenMP thread against torch's default, beside busy processes.

Why the test suite runs every process on one thread (tests/conftest.py): `make test` runs 3 workers on a 2-core
machine, each starting trainings, so a training's OpenMP threads wait for a core, and libgomp's waiting threads spin.
This script reproduces that: `--busy` pure-Python busy loops hold the cores (as the other workers do), and the same
`python -m pretrain train` (the suite's tiny model on synthetic tokens) runs alternately with OMP_NUM_THREADS=1 and
without it, `--repeats` times. It prints the median CPU and wall seconds of each and their ratios.

    .venv/bin/python benchmarks/bench_test_threads.py [--busy 2] [--steps 20] [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TINY = ["preset=tiny", "model.vocab_size=512", "schedule.global_batch_size=8", "schedule.micro_batch_size=2",
        "data.synthetic=true", "logging.log_interval=10", "logging.eval_interval=1000"]


def train_once(steps: int, threads: str | None) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one tiny training; threads None leaves torch's default."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env.update(PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="", **({"OMP_NUM_THREADS": threads} if threads else {}))
    with tempfile.TemporaryDirectory() as save:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "pretrain", "train", "--set", *TINY, f"schedule.train_iters={steps}",
                        f"checkpoint.save={save}"], check=True, env=env, cwd=REPO, timeout=1800,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def main() -> None:
    """Start the busy loops, measure both variants alternately, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy", type=int, default=2, help="busy-loop processes beside the training")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        samples: dict[str, list[tuple[float, float]]] = {"one thread": [], "torch's default": []}
        for _ in range(args.repeats):
            samples["one thread"].append(train_once(args.steps, "1"))
            samples["torch's default"].append(train_once(args.steps, None))
    finally:
        for proc in busy:
            proc.kill()
    medians = {name: (statistics.median(c for c, _ in runs), statistics.median(w for _, w in runs))
               for name, runs in samples.items()}
    print(f"{args.steps}-step tiny training beside {args.busy} busy processes, {os.cpu_count()} cores, "
          f"median of {args.repeats}")
    for name, (cpu, wall) in medians.items():
        print(f"  {name:<16} {cpu:7.1f} CPU-s {wall:7.1f} s wall")
    (one_cpu, one_wall), (default_cpu, default_wall) = medians["one thread"], medians["torch's default"]
    print(f"torch's default / one thread: CPU {default_cpu / one_cpu:.2f}x, wall {default_wall / one_wall:.2f}x")


if __name__ == "__main__":
    main()
