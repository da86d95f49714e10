"""The cliff of stored evaluation records, measured again from their mean per-position loss curves under today's
in-distribution range (pretrain/evaluation/ranges.py), for results whose checkpoints are gone.

A record of `reproduce` stores the mean loss curve of its spans; the cliff is a difference of means over target
ranges of that curve, so it can be taken again exactly (the per-span standard error cannot: it needs per-span
losses over the new range, which only a new evaluation gives).

    python benchmarks/cliff_from_curves.py benchmarks/results/gpu_h200_10m_methods_115M/eval
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from pretrain.evaluation.metrics import cliff  # noqa: E402


def curve_cliff(curve: list[float], window: int) -> dict[str, float]:
    """{'in_start', 'in_dist', 'ood', 'cliff'} of a mean loss curve (index i = target i + 1) for window w: metrics.cliff
    on the curve as one span, which is exact because every span has the same targets."""
    return cliff(torch.tensor(curve, dtype=torch.float64), window)


def main(argv: list[str] | None = None) -> int:
    """Print one line per record of the directory: label, stored cliff, cliff under today's range."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path, help="a directory of `reproduce` evaluation records (eval/*.json)")
    args = parser.parse_args(argv)
    paths = sorted(args.directory.glob("*.json"))
    if not paths:
        parser.error(f"no evaluation records (*.json) in {args.directory}")
    print(f"{'record':<24} {'targets':>10} {'in-dist':>8} {'beyond w':>8} {'cliff':>8}  stored cliff")
    for path in paths:
        record = json.loads(path.read_text())
        for length, entry in record["lengths"].items():
            window = record["train_window"]
            now = curve_cliff(entry["curve"], window)
            targets = f"{now['in_start']}–{window}"
            print(f"{path.stem:<24} {targets:>10} {now['in_dist']:8.3f} {now['ood']:8.3f} "
                  f"{now['cliff']:8.3f}  {entry['cliff']['cliff']:.3f} (L = {length})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
