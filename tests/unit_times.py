"""The suite's time per work unit, printed at the end of every run, so that the unit that grew is visible in the CI
log (issue 43's budget). A unit is what one xdist worker runs in one go: a test module, or the tests of one local
SLURM cluster (tests/conftest.py's `_work_unit` decides). Time is the sum of each test's setup, call and teardown as
the worker measured it, so a unit's time is its share of one worker's wall time (on the controller, with or without
xdist). Beside it, the CPU time the unit used: the worker's own and that of the child processes it waited for
(subprocesses, torchrun and its ranks; not SLURM jobs, which slurmd runs), so a unit that mostly waits shows a low
CPU share and the machine's utilisation over the run is the total CPU over (cores x wall). With POSAUG_UNIT_TIMES set
to a path, every test's time and CPU time are also written there (a TSV: unit, test, seconds, CPU seconds), the data
for choosing what to make cheaper next.
"""

from __future__ import annotations

import os
import resource
from collections import defaultdict
from typing import Callable

SHOWN = 20
TSV_ENV = "POSAUG_UNIT_TIMES"


class UnitTimes:
    """Collects test durations by work unit from the reports the controller receives."""

    def __init__(self, unit_of: Callable[[str], str]) -> None:
        self.unit_of = unit_of
        self.by_test: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])  # test -> [seconds, CPU seconds]

    def add(self, nodeid: str, seconds: float, cpu_seconds: float = 0.0) -> None:
        """Count one phase (setup, call or teardown) of one test."""
        self.by_test[nodeid][0] += seconds
        self.by_test[nodeid][1] += cpu_seconds

    @property
    def seconds(self) -> dict[str, float]:
        """Each unit's summed test time."""
        return self._per_unit(0)

    @property
    def cpu_seconds(self) -> dict[str, float]:
        """Each unit's summed CPU time."""
        return self._per_unit(1)

    @property
    def tests(self) -> dict[str, set[str]]:
        """Each unit's tests."""
        units: dict[str, set[str]] = defaultdict(set)
        for test in self.by_test:
            units[self.unit_of(test)].add(test)
        return units

    def _per_unit(self, column: int) -> dict[str, float]:
        totals: dict[str, float] = defaultdict(float)
        for test, values in self.by_test.items():
            totals[self.unit_of(test)] += values[column]
        return totals

    def lines(self, shown: int = SHOWN) -> list[str]:
        """The slowest units, longest first, with the total over all units."""
        seconds_of, cpu_of, tests_of = self.seconds, self.cpu_seconds, self.tests
        ranked = sorted(seconds_of.items(), key=lambda item: -item[1])
        total, cpu_total = sum(seconds_of.values()), sum(cpu_of.values())
        out = [f"{'minutes':>8}  {'cpu min':>7}  {'tests':>5}  unit (slowest {min(shown, len(ranked))} of {len(ranked)})"]
        out += [f"{seconds / 60:8.1f}  {cpu_of[unit] / 60:7.1f}  {len(tests_of[unit]):5d}  {unit}"
                for unit, seconds in ranked[:shown]]
        out.append(f"{total / 60:8.1f}  {cpu_total / 60:7.1f}  {len(self.by_test):5d}  "
                   f"all units (worker time, summed over workers)")
        return out

    def write_tsv(self, path: str) -> None:
        """Every test's unit, time and CPU time, most CPU first."""
        rows = sorted(self.by_test.items(), key=lambda item: -item[1][1])
        with open(path, "w") as out:
            out.write("unit\ttest\tseconds\tcpu_seconds\n")
            out.writelines(f"{self.unit_of(test)}\t{test}\t{seconds:.2f}\t{cpu:.2f}\n" for test, (seconds, cpu) in rows)


def cpu_seconds_now() -> float:
    """User + system time of this process and of the children it has waited for."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def report(unit_times: UnitTimes, terminalreporter) -> None:
    """Print the table as a section of pytest's summary."""
    if not unit_times.by_test:
        return
    terminalreporter.section("time per work unit")
    for line in unit_times.lines():
        terminalreporter.write_line(line)
    if path := os.environ.get(TSV_ENV):
        unit_times.write_tsv(path)
        terminalreporter.write_line(f"every test's time and CPU time: {path}")
