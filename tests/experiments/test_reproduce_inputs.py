"""`reproduce` refuses a missing `--input` before it writes anything: one line, exit 2, no output folder."""

import subprocess
import sys

import pytest

from conftest import REPO


@pytest.mark.parametrize("suite", [[], ["--suite", "ablations"], ["--suite", "documents"]], ids=["lm", "ablations",
                                                                                                "documents"])
def test_a_missing_input_is_one_line_and_leaves_no_output_folder(tmp_path, suite):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "pretrain", "reproduce", *suite, "--input", str(tmp_path / "nope.jsonl"),
                           "--output", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    [line] = [line for line in proc.stderr.splitlines() if "error:" in line]  # after argparse's usage lines
    assert "argument --input" in line and "nope.jsonl does not exist" in line and not out.exists()
