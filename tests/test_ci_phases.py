"""`make test`'s phase clock (tests/ci_phases.py): each phase's wall time, the table against the budget, and a
failing phase's exit code passed through with the table so far."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent / "ci_phases.py"
REPO = SCRIPT.parents[1]


def phases(log: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--log", str(log), *args], capture_output=True, text=True,
                          timeout=60)


def test_each_phase_is_timed_and_the_report_lists_them_in_order_with_the_total_and_the_budget(tmp_path):
    log = tmp_path / "phases.tsv"
    assert phases(log, "start").returncode == 0
    assert phases(log, "run", "install", "--", sys.executable, "-c", "import time; time.sleep(0.3)").returncode == 0
    assert phases(log, "run", "suite", "--", sys.executable, "-c", "pass").returncode == 0
    report = phases(log, "report", "--budget-minutes", "40").stdout.splitlines()
    assert [line.split()[0] for line in report[1:4]] == ["install", "suite", "total"]
    assert report[1].split()[1] == "0.0" and report[1].endswith("ok")  # minutes, one decimal
    assert report[-1].startswith("budget 40 min on a quiet 2-core machine") and "within" in report[-1]


def test_a_failing_phase_exits_with_its_code_and_prints_the_table_so_far(tmp_path):
    log = tmp_path / "phases.tsv"
    phases(log, "start")
    proc = phases(log, "run", "broken suite", "--", sys.executable, "-c", "raise SystemExit(3)")
    assert proc.returncode == 3
    assert "broken suite" in proc.stdout and "FAILED (exit 3)" in proc.stdout


def test_a_phase_over_the_budget_is_reported_over(tmp_path):
    log = tmp_path / "phases.tsv"
    log.write_text("whole suite\t3000.0\t0\t1.0\t2.0\n")  # 50 minutes
    assert "OVER (125% of it)" in phases(log, "report", "--budget-minutes", "40").stdout


def test_start_forgets_the_phases_of_an_earlier_run(tmp_path):
    log = tmp_path / "phases.tsv"
    log.write_text("old phase\t60.0\t0\t1.0\t1.0\n")
    phases(log, "start")
    assert "old phase" not in phases(log, "report").stdout


def test_a_command_that_does_not_exist_fails_the_phase_with_one_line(tmp_path):
    log = tmp_path / "phases.tsv"
    proc = phases(log, "run", "missing", "--", str(tmp_path / "no-such-program"))
    assert proc.returncode == 127 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: phase 'missing': cannot run ")


def test_each_phase_reports_the_share_of_the_cores_it_kept_busy(tmp_path):
    log = tmp_path / "phases.tsv"
    phases(log, "start")
    phases(log, "run", "spin", "--", sys.executable, "-c", "import time\nend = time.time() + 1\nwhile time.time() < end: pass")
    row = phases(log, "report").stdout.splitlines()[1]
    busy = int(row.split()[-2].rstrip("%"))
    assert 0 < busy <= 100  # one spinning process keeps at least part of the machine busy


def test_a_record_written_before_the_busy_column_still_reports(tmp_path):
    log = tmp_path / "phases.tsv"
    log.write_text("old phase\t60.0\t0\t1.0\t1.0\n")
    row = phases(log, "report").stdout.splitlines()[1]
    assert row.split()[:2] == ["old", "phase"] and row.split()[-2:] == ["?", "ok"]


def test_the_budget_is_20_minutes_in_the_makefile_and_in_docs_testing():
    makefile = (REPO / "Makefile").read_text()
    assert "TEST_BUDGET_MINUTES := 20\n" in makefile and "--budget-minutes $(TEST_BUDGET_MINUTES)" in makefile
    assert "**Budget: 20 minutes on a quiet 2-core machine" in (REPO / "docs" / "testing.md").read_text()


def test_the_report_gives_the_machines_speed_at_the_start_and_at_the_end(tmp_path):
    log = tmp_path / "phases.tsv"
    phases(log, "start")
    phases(log, "run", "suite", "--", sys.executable, "-c", "pass")
    report = phases(log, "report", "--budget-minutes", "20").stdout.splitlines()
    speed = next(line for line in report if line.startswith("machine speed:"))
    assert re.fullmatch(r"machine speed: 5,000,000 Python additions took \d+\.\d\d CPU-s at the start, "
                        r"\d+\.\d\d at the end", speed), speed
    assert report[-1].startswith("budget 20 min")
