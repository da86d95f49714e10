"""`make test`'s phase clock: runs each phase (an install, a suite on one Megatron-Core), records its wall time and
prints the table of phases against the CI budget (with the share of the machine's cores each phase kept busy: a
phase far below 100 % waits more than it computes), so that the growth of any phase is visible in every CI log.

    python3 tests/ci_phases.py --log FILE start
    python3 tests/ci_phases.py --log FILE run "NAME" -- COMMAND...   # exits with COMMAND's code
    python3 tests/ci_phases.py --log FILE report --budget-minutes 40

Standard library only: it runs before any virtual environment exists. A failing phase prints the table so far.
`start` and `report` also time a fixed pure-Python loop (CPU seconds, so other load does not count): this VM's speed
moves with its host (benchmarks/bench_zygote.py's exec'ed tiny training, same code: 4.21 CPU-s on 2026-12-02, 6.6 on
2026-12-03; a Python loop 1.8x slower at 12:55 UTC than a minute later), so a total is read with its speed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

SPEED_LOOP = 5_000_000  # additions: 0.2 CPU-s on the 2-core machine the budget is set on, when its host is fast
SPEED_LINE = "#speed"


def loop_seconds() -> float:
    """CPU seconds this process takes for SPEED_LOOP additions: how fast one core of the machine is now."""
    started, total = time.process_time(), 0
    for value in range(SPEED_LOOP):
        total += value
    return time.process_time() - started


def load_average() -> str:
    """The 1-minute load average (a phase's time means little without the machine's other load)."""
    try:
        return f"{os.getloadavg()[0]:.1f}"
    except OSError:
        return "?"


def cpu_ticks() -> tuple[int, int] | None:
    """(busy, total) CPU ticks of the whole machine since boot (/proc/stat), or None where there is none."""
    try:
        fields = [int(value) for value in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields[:8]) - idle, sum(fields[:8])  # guest time is already inside user


def busy_share(start: tuple[int, int] | None, end: tuple[int, int] | None) -> str:
    """The share of all cores' time spent busy between two readings: whether a phase computed or waited."""
    if start is None or end is None or end[1] <= start[1]:
        return "?"
    return f"{(end[0] - start[0]) / (end[1] - start[1]):.0%}"


def read_phases(log: Path) -> list[tuple[str, float, int, str, str, str]]:
    """(name, seconds, exit code, load at start, load at end, CPU busy share) of every phase recorded in `log`."""
    if not log.exists():
        return []
    phases = []
    for line in log.read_text().splitlines():
        if line.startswith(SPEED_LINE):
            continue
        name, seconds, code, load_start, load_end, *busy = line.split("\t")
        phases.append((name, float(seconds), int(code), load_start, load_end, busy[0] if busy else "?"))
    return phases


def start_speed(log: Path) -> str | None:
    """The loop's CPU seconds that `start` recorded, or None."""
    lines = [line for line in log.read_text().splitlines() if line.startswith(SPEED_LINE)] if log.exists() else []
    return lines[0].split("\t")[1] if lines else None


def table(log: Path, budget_minutes: float | None, end_speed: float | None = None) -> str:
    """The phase table: each phase's minutes and the machine's load around it, the total, the machine's speed and
    the budget."""
    phases = read_phases(log)
    width = max([len(name) for name, *_ in phases] + [len("total")])
    lines = [f"{'phase':<{width}}  {'minutes':>7}  load (start/end)  cpu busy  result"]
    for name, seconds, code, load_start, load_end, busy in phases:
        result = "ok" if code == 0 else f"FAILED (exit {code})"
        lines.append(f"{name:<{width}}  {seconds / 60:>7.1f}  {load_start:>6} / {load_end:<6}   {busy:>8}  {result}")
    total = sum(seconds for _, seconds, *_ in phases) / 60
    lines.append(f"{'total':<{width}}  {total:>7.1f}")
    if (speed := start_speed(log)) is not None:
        at_end = "" if end_speed is None else f", {end_speed:.2f} at the end"
        lines.append(f"machine speed: {SPEED_LOOP:,} Python additions took {speed} CPU-s at the start{at_end}")
    if budget_minutes is not None:
        verdict = "within" if total <= budget_minutes else "OVER"
        lines.append(f"budget {budget_minutes:g} min on a quiet 2-core machine (CI's hard limit is 90): {verdict} "
                     f"({total / budget_minutes:.0%} of it)")
    return "\n".join(lines)


def run_phase(log: Path, name: str, command: list[str]) -> int:
    """Run one phase, append its time to `log`; on failure print the table so far. Returns the command's code."""
    if "\t" in name or "\n" in name:
        raise SystemExit(f"error: phase name {name!r} must not contain tabs or newlines")
    print(f"==== phase: {name}", flush=True)
    load_start, ticks_start, start = load_average(), cpu_ticks(), time.monotonic()
    try:
        code = subprocess.call(command)
    except OSError as error:
        print(f"error: phase {name!r}: cannot run {command[0]!r}: {error.strerror}", file=sys.stderr)
        code = 127
    seconds = time.monotonic() - start
    with log.open("a") as handle:
        handle.write(f"{name}\t{seconds:.1f}\t{code}\t{load_start}\t{load_average()}\t"
                     f"{busy_share(ticks_start, cpu_ticks())}\n")
    print(f"==== phase: {name}: {seconds / 60:.1f} min{'' if code == 0 else f', exit {code}'}", flush=True)
    if code != 0:
        print(table(log, None), flush=True)
    return code


def main(argv: list[str] | None = None) -> int:
    """The CLI above."""
    parser = argparse.ArgumentParser(prog="tests/ci_phases.py", description=__doc__.splitlines()[0])
    parser.add_argument("--log", type=Path, required=True, help="the phase record of this `make test`")
    verbs = parser.add_subparsers(dest="verb", required=True)
    verbs.add_parser("start", help="begin a new record (forget an earlier run's phases)")
    run = verbs.add_parser("run", help="run one phase: NAME -- COMMAND...")
    run.add_argument("name")
    run.add_argument("command", nargs=argparse.REMAINDER)
    report = verbs.add_parser("report", help="print the phase table")
    report.add_argument("--budget-minutes", type=float, default=None)
    args = parser.parse_args(argv)
    if args.verb == "start":
        args.log.write_text(f"{SPEED_LINE}\t{loop_seconds():.2f}\n")
        return 0
    if args.verb == "report":
        print(table(args.log, args.budget_minutes, loop_seconds()))
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("error: run needs a command after the phase name: run NAME -- COMMAND...", file=sys.stderr)
        return 2
    return run_phase(args.log, args.name, command)


if __name__ == "__main__":
    sys.exit(main())
