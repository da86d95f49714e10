"""`python -m pretrain selfcheck` on CPU: versions, devices and a real 5-step training pass; every CUDA
check is skipped with the reason. ~30 s."""

import importlib.metadata
import os
import subprocess
import sys

from conftest import REPO
from pretrain.selfcheck import CUDA_CHECKS


def test_selfcheck_cpu_part_passes_and_cuda_checks_skip_with_the_reason():
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-m", "pretrain", "selfcheck"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    rows = {line[:40].strip(): line[40:].split(None, 1) for line in proc.stdout.splitlines()[:-1]}
    megatron_core = importlib.metadata.version("megatron-core")
    assert rows["versions"][0] == "INFO" and f"megatron-core {megatron_core}" in rows["versions"][1]
    assert rows["megatron-core range"] == ["PASS", f"{megatron_core}: tested (>=0.16.1,<0.20; tested: 0.16.1, 0.19.2)"]
    assert rows["tiny training (local, 5 steps)"][0] == "PASS" and "MFU" in rows["tiny training (local, 5 steps)"][1]
    assert rows["local attention: SDPA vs Megatron"][0] == "PASS"
    for name in CUDA_CHECKS:
        assert rows[name] == ["SKIP", "no CUDA"], name
    assert proc.stdout.splitlines()[-1] == f"all checks passed ({len(CUDA_CHECKS)} skipped)"
    assert "Warning" not in proc.stderr
