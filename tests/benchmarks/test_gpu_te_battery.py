"""The Transformer Engine battery (benchmarks/gpu_te/battery.py) on CPU: its cpu-tiny dry run, the selfcheck table
it reads, and its refusal to run the gpu preset without TE."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks" / "gpu_te"))

import battery  # noqa: E402


def test_the_selfcheck_table_is_read_row_by_row():
    from pretrain.selfcheck import Check, format_table

    table = format_table([Check("versions", "INFO", "torch 2"), Check("TE vs local logits", "PASS", "max 1e-3"),
                          Check("FP8 step (Hopper)", "SKIP", "no CUDA")])
    assert battery.parse_selfcheck(table) == {"versions": "INFO", "TE vs local logits": "PASS",
                                              "FP8 step (Hopper)": "SKIP"}


def test_the_battery_reads_the_four_te_checks_by_the_names_selfcheck_gives_them():
    from pretrain.selfcheck import CUDA_CHECKS

    assert set(battery.TE_SELFCHECKS) <= set(CUDA_CHECKS)


def test_the_gpu_preset_without_transformer_engine_is_refused_in_one_line():
    result = subprocess.run([sys.executable, str(REPO / "benchmarks/gpu_te/battery.py"), "--preset", "gpu"],
                            capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "--preset cpu-tiny" in result.stderr


@pytest.mark.slow
def test_the_cpu_tiny_dry_run_trains_the_local_side_and_skips_every_te_step_with_its_reason(tmp_path):
    result = subprocess.run([sys.executable, str(REPO / "benchmarks/gpu_te/battery.py"), "--preset", "cpu-tiny",
                             "--output", str(tmp_path)], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    table = (tmp_path / "te_battery.txt").read_text().splitlines()
    assert table[-1] == "battery passed (dry run)"
    rows = table[:-1]
    assert len(rows) == 8 and all("  SKIP  no CUDA on this machine" in row for row in rows)
    assert "the local side trained: baseline: local" in rows[1] and "posaug: local" in rows[1]
