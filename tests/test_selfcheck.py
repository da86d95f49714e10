"""`python -m pretrain selfcheck` on CPU: versions, devices, a real 5-step training and every private Megatron reach
exercised pass; every CUDA check is skipped with the reason; a reach taken away fails, named. ~30 s each."""

import importlib.metadata
import os
import re
import subprocess
import sys

import pytest

from conftest import REPO
from megatron_ext.versions import MODEL_REACHES, REACHES, TESTED_MEGATRON_CORE
from pretrain.selfcheck import CUDA_CHECKS

ENV = dict(os.environ, PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="")


def _rows(stdout: str) -> dict[str, list[str]]:
    """{check name: [status, detail]}: the table's columns are separated by two or more spaces."""
    return {name: rest for name, *rest in (re.split(r"\s{2,}", line, maxsplit=2) for line in stdout.splitlines()[:-1])}


def test_selfcheck_cpu_part_passes_and_cuda_checks_skip_with_the_reason():
    proc = subprocess.run([sys.executable, "-m", "pretrain", "selfcheck"], cwd=REPO, env=ENV, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    rows = _rows(proc.stdout)
    megatron_core = importlib.metadata.version("megatron-core")
    assert rows["versions"][0] == "INFO" and f"megatron-core {megatron_core}" in rows["versions"][1]
    assert rows["megatron-core range"] == ["INFO", f"{megatron_core}: tested (>=0.16.1,<0.20; tested: "
                                           f"{', '.join(TESTED_MEGATRON_CORE)})"]
    for reach in [*REACHES, *MODEL_REACHES]:
        assert rows[f"reach: {reach}"][0] == "PASS", rows[f"reach: {reach}"]
    assert rows["tiny training (local, 5 steps)"][0] == "PASS" and "MFU" in rows["tiny training (local, 5 steps)"][1]
    assert rows["local attention: SDPA vs Megatron"][0] == "PASS"
    for name in CUDA_CHECKS:
        assert rows[name] == ["SKIP", "no CUDA"], name
    assert proc.stdout.splitlines()[-1] == f"all checks passed ({len(CUDA_CHECKS)} skipped)"
    assert "Warning" not in proc.stderr


# Each driver deletes a reach from the imported Megatron (every spelling of it), then runs selfcheck in-process.
REMOVE = {
    "write_results_queue": "from megatron.core.dist_checkpointing.strategies import filesystem_async as m\n"
                           "for name in ('get_write_results_queue', '_get_write_results_queue'):\n"
                           "    m.__dict__.pop(name, None)",
    "gpt_preprocess": "from megatron.core.models.gpt.gpt_model import GPTModel\ndel GPTModel._preprocess",
}


@pytest.mark.parametrize("reach", sorted(REMOVE))
def test_selfcheck_fails_naming_a_reach_that_megatron_lacks(reach):
    driver = ("import sys\nimport megatron_ext.cpu_compat\nmegatron_ext.cpu_compat.apply()\n" + REMOVE[reach]
              + "\nfrom pretrain.selfcheck import main\nsys.exit(main(['--cpu-only']))")
    proc = subprocess.run([sys.executable, "-c", driver], cwd=REPO, env=ENV, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    rows = _rows(proc.stdout)
    status, detail = rows[f"reach: {reach}"]
    assert status == "FAIL" and REACHES[reach].describe() in detail and REACHES[reach].user in detail, detail
    assert f"reach: {reach}" in proc.stdout.splitlines()[-1]
