"""`reproduce` when a run's training process fails: the trainer's own error, then one line naming the run, its
config and how to resume, and the trainer's exit code (a wrapper acts on it, e.g. the hang code) without a
traceback. Seen on 2026-11-28: a starved background run's hang exit (76) ended in a RuntimeError traceback."""

import os
import subprocess
import sys

from conftest import REPO


def test_a_failed_training_is_one_line_naming_the_run_with_the_trainers_exit_code(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="")
    # Transformer Engine on CPU passes reproduce's checks and is refused by the trainer, exit 2, in one line.
    proc = subprocess.run([sys.executable, "-m", "pretrain", "reproduce", "--preset", "cpu-tiny", "--methods",
                           "baseline", "--output", str(tmp_path / "out"), "--set",
                           "model.transformer_impl=transformer_engine"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 2 and "transformer_engine needs a CUDA GPU" in errors[0], errors
    assert errors[1].startswith("error: training baseline_s42 failed with exit code 2") and "resumes" in errors[1]
