"""The summed rate of runs trained side by side on one GPU, per logging window, from their stored trainer logs.

    python3 benchmarks/side_by_side_rates.py benchmarks/results/gpu_h200_10m_methods/logs ...

Each trainer logs its own tokens/s over the window since its previous log line; runs started together log the same
steps, so the sum over runs at one step is what the GPU did together in that window, as long as every run was
still training through it. A window holding a checkpoint save or validation is slower; the last window is not
comparable (runs finish at different times, so the last ones have the GPU to themselves for a while).
Standard library only.
"""

from __future__ import annotations

import re
import sys
from collections import defaultdict
from pathlib import Path

STEP = re.compile(r"^step (\d+)/(\d+) \|.*\| ([\d.]+)K tok/s")


def windows(folder: Path) -> dict[int, dict[str, float]]:
    """step -> {run: tokens/s} over the folder's *_s*.log trainer logs."""
    by_step: dict[int, dict[str, float]] = defaultdict(dict)
    for log in sorted(folder.glob("*_s[0-9]*.log")):
        for line in log.read_text().splitlines():
            match = STEP.match(line)
            if match:
                by_step[int(match.group(1))][log.stem] = float(match.group(3)) * 1e3
    return dict(by_step)


def main(argv: list[str]) -> int:
    """Print one table per folder: step, runs logging, the sum, each run's rate."""
    if not argv:
        print("side_by_side_rates: name one or more folders of trainer logs", file=sys.stderr)
        return 2
    for folder in map(Path, argv):
        rates = windows(folder)
        if not rates:
            print(f"side_by_side_rates: no trainer logs (*_sN.log with step lines) in {folder}", file=sys.stderr)
            return 2
        runs = sorted({run for step in rates.values() for run in step})
        print(f"{folder}: {len(runs)} runs ({', '.join(runs)})")
        print(f"{'step':>6}{'runs':>6}{'together':>12}  each (K tokens/s)")
        for step, each in sorted(rates.items()):
            print(f"{step:>6}{len(each):>6}{sum(each.values()) / 1e6:>11.3f}M  "
                  + " ".join(f"{each[r] / 1e3:.1f}" if r in each else "-" for r in runs))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
