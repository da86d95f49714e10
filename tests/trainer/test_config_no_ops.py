"""Settings that change nothing in the run (issue 68), at `train --check` as the launchers' pre-flight runs it: a
layer frequency above the layer count (no global / no NoPE layer: the model `null` gives) is refused in one line,
exit 2; a sliding window that holds a whole training sequence is trained with a one-line note saying what it does
(pretrain/trainer/config_no_ops.py says why each is refused or noted)."""

import os
import subprocess
import sys

import pytest

from conftest import REPO, one_error_line

TINY = ["preset=tiny", "data.synthetic=true", "model.seq_length=32"]  # 4 layers


def check(*overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pretrain", "train", "--check", "--set", *TINY, *overrides],
                          cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES=""),
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("overrides, field", [
    (("model.window_size=8", "model.window_attn_skip_freq=5"), "model.window_attn_skip_freq=5"),
    (("model.no_rope_freq=5",), "model.no_rope_freq=5"),
])
def test_a_layer_frequency_above_the_layer_count_is_refused_at_check_in_one_line(overrides, field):
    line = one_error_line(check(*overrides))
    assert line.startswith(f"error: {field} ") and "the model has 4 layers" in line, line
    assert "set it to at most 4" in line and "or null" in line, line


def test_a_layer_frequency_equal_to_the_layer_count_is_accepted_at_check():
    proc = check("model.no_rope_freq=4", "model.window_size=8", "model.window_attn_skip_freq=4")
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.parametrize("window, noted", [(1_000_000, True), (31, True), (30, False)])
def test_a_sliding_window_holding_a_whole_training_sequence_is_noted_at_check(window, noted):
    proc = check(f"model.window_size={window}", "model.window_attn_skip_freq=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "check: config, data and layout are fine" in proc.stdout
    notes = [line for line in proc.stderr.splitlines() if line.startswith("note:")]
    if not noted:  # 30 keys before the last query: its key 0 is outside the window, the window acts in training
        assert notes == [], proc.stderr
        return
    assert len(notes) == 1, proc.stderr
    assert f"model.window_size={window} holds a whole training sequence (model.seq_length=32" in notes[0]
    assert f"contexts longer than {window + 1} tokens" in notes[0]
