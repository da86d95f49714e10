"""`python -m pretrain runs DIR`: every training run under DIR with its size, method, seed,
iteration and state (finished / running / stopped / failed / hung); the discovery is pretrain/runs.py."""

from __future__ import annotations

import sys

from pretrain.cli import Parser
from pretrain.runs import STALE_AFTER_S, Run, discover


def format_table(runs: list[Run]) -> str:
    """Plain-text table, one run a line."""
    header = ("run", "size", "method", "seed", "iteration", "state", "")
    rows = [(r.name, r.size, r.method, "" if r.seed is None else str(r.seed),
             f"{r.iteration}/{r.train_iters if r.train_iters is not None else '?'}", r.state, r.detail)
            for r in runs]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header) - 1)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + ("  " + row[-1] if row[-1] else "")
             for row in [header, *rows]]
    return "\n".join(line.rstrip() for line in lines)


def main(argv: list[str]) -> int:
    """CLI for `python -m pretrain runs`."""
    parser = Parser(prog="python -m pretrain runs", description=__doc__.split("\n")[0])
    parser.add_argument("directory", help="a directory of run directories (or one run directory)")
    parser.add_argument("--stale-after", type=float, default=STALE_AFTER_S / 60, metavar="MIN",
                        help="minutes without a heartbeat after which a run on another host counts as failed")
    args = parser.parse_args(argv)
    try:
        runs = discover(args.directory, args.stale_after * 60)
    except FileNotFoundError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if not runs:
        print(f"error: no runs under {args.directory} (a run directory holds the trainer's config.yaml)",
              file=sys.stderr)
        return 2
    print(format_table(runs))
    counts = {s: sum(r.state == s for r in runs) for s in ("finished", "running", "stopped", "failed", "hung")}
    print(", ".join(f"{n} {s}" for s, n in counts.items() if n) + f" ({len(runs)} runs)")
    return 0
