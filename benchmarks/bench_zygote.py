"""CPU and wall time of the test suite's `python -m pretrain` processes exec'ed against forked from its zygote.

Why tests/zygote.py exists: every training, evaluation or export a test starts pays the imports of torch and
megatron.core before its first step. This script runs the same commands alternately exec'ed (POSAUG_ZYGOTE=0) and
forked from one zygote (started once, its own start-up printed apart), `--repeats` times each, and prints the median
CPU seconds (the child's own, as the suite's unit times count them) and wall seconds of each and their ratios:
a 3-step tiny training on synthetic tokens, and a command refused at argument parsing (`train` with an unknown
field), whose whole cost is start-up and exit.

    .venv/bin/python benchmarks/bench_zygote.py [--repeats 3]
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
sys.path.insert(0, str(REPO / "tests"))
os.environ.setdefault("OMP_NUM_THREADS", "1")  # as the suite runs (tests/conftest.py)

import zygote  # noqa: E402

TINY = ["preset=tiny", "model.vocab_size=512", "schedule.global_batch_size=8", "schedule.micro_batch_size=2",
        "data.synthetic=true", "schedule.train_iters=3", "logging.log_interval=10", "logging.eval_interval=1000"]
COMMANDS = {"tiny training (3 steps)": ["train", "--set", *TINY, "checkpoint.save={out}"],
            "refused at parsing": ["train", "--set", "model.no_such_field=1"]}


def run_once(argv: list[str], forked: bool, out: Path) -> tuple[float, float]:
    """(child CPU seconds, wall seconds) of one `python -m pretrain` command."""
    env = dict(os.environ, PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="", POSAUG_ZYGOTE="1" if forked else "0")
    before, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    proc = zygote.ZygotePopen([sys.executable, "-m", "pretrain", *(arg.format(out=out) for arg in argv)], cwd=REPO,
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    proc.wait()
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, wall


def main() -> int:
    """Print the medians and ratios."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    env = dict(os.environ, PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="")
    started = time.perf_counter()
    server = zygote.server_for(env)
    assert server is not None, "the zygote refused to serve (its stderr says why)"
    print(f"zygote start-up (once per pytest process): {time.perf_counter() - started:.1f} s wall; "
          f"load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as scratch:
        for name, argv in COMMANDS.items():
            times: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
            for repeat in range(args.repeats):
                for forked in (False, True):
                    times[forked].append(run_once(argv, forked, Path(scratch, f"{name[:4]}{repeat}{forked}")))
            cpu = {k: statistics.median(t[0] for t in v) for k, v in times.items()}
            wall = {k: statistics.median(t[1] for t in v) for k, v in times.items()}
            print(f"{name}: exec'ed {cpu[False]:.2f} CPU-s / {wall[False]:.2f} s wall; forked {cpu[True]:.2f} CPU-s / "
                  f"{wall[True]:.2f} s wall; forked / exec'ed: CPU {cpu[True] / cpu[False]:.2f}x, wall "
                  f"{wall[True] / wall[False]:.2f}x ({args.repeats} repeats, medians)")
    zygote.close_all()
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
