"""`pretrain plan` against what Megatron allocates per rank for bf16 + the distributed optimizer at DP=2 (gloo).

    .venv/bin/python benchmarks/bench_plan_distopt.py [--presets tiny 10m] [--seq 64] [--nproc 2]

For each preset, one torchrun launch of tests/distributed/distopt_state_bytes.py (local layers, bf16,
parallel.use_distributed_optimizer=true, one optimizer step) prints each rank's tensor bytes: bf16 weights,
DDP gradient buffers, the fp32 main-param shard and the Adam state (exp_avg, exp_avg_sq, step); this script
prints measured / planned for each term and rank. Tensor bytes, not RSS.
"""

import argparse
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from conftest import results  # noqa: E402

TERMS = ("weights", "grads", "main_params", "adam")


def measure(preset: str, seq: int, nproc: int) -> list[dict]:
    """Each rank's RESULT record of one torchrun launch."""
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               str(REPO / "tests/distributed/distopt_state_bytes.py"), "--preset", preset, "--seq", str(seq)]
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return sorted(results(proc.stdout), key=lambda r: r["rank"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--presets", nargs="+", default=["tiny", "10m"])
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--nproc", type=int, default=2)
    args = parser.parse_args()
    print(f"bf16 + distributed optimizer, DP={args.nproc} (gloo, CPU), local layers, seq {args.seq}; "
          "measured / planned bytes per rank (measured MiB in brackets)")
    print(f"{'preset':<8}{'rank':>5}" + "".join(f"{t:>22}" for t in TERMS))
    for preset in args.presets:
        for r in measure(preset, args.seq, args.nproc):
            cells = "".join(f"{r['measured'][t] / r['planned'][t]:>11.5f} ({r['measured'][t] / 2**20:>7.3f})"
                            for t in TERMS)
            print(f"{preset:<8}{r['rank']:>5}{cells}", flush=True)


if __name__ == "__main__":
    main()
