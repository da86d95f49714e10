"""`eval` checks every count, length and size flag before it loads a model: out of range is one line naming
the flag (exit 2). Real CLI runs, refused before any model is read."""

import os
import subprocess
import sys

import pytest

from conftest import REPO


@pytest.mark.parametrize("flag, value, message", [
    ("--batch-size", "0", "--batch-size must be positive, got 0"),
    ("--num-spans", "-1", "--num-spans must be positive, got -1"),
    ("--lengths", "32,0", "--lengths must be positive, got 0"),
    ("--factor", "0.5", "--factor must be at least 1"),
])
def test_an_out_of_range_flag_is_refused_naming_it(tmp_path, flag, value, message):
    env = dict(os.environ, PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="")
    args = ["--lengths", "32"] if flag != "--lengths" else []
    proc = subprocess.run([sys.executable, "-m", "pretrain", "eval", "run", str(tmp_path / "model"), "--data",
                           str(tmp_path / "text.txt"), *args, flag, value, "--output", str(tmp_path / "out")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and message in errors[0], proc.stderr[-3000:]
    assert not (tmp_path / "out").exists()
