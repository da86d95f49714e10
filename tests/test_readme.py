"""The README is a front door: at most 150 lines, every command it shows exists and parses, and its demo table is
the stored demo result's (benchmarks/readme_demo_table.py)."""

import os
import re
import subprocess
import sys

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))

import readme_demo_table  # noqa: E402

README = (REPO / "README.md").read_text()


def _shown_commands() -> list[list[str]]:
    blocks = re.findall(r"```bash\n(.*?)```", README, re.S)
    commands = []
    for block in blocks:
        for line in block.splitlines():
            words = line.split("#")[0].split()
            while words and "=" in words[0]:  # VAR=value prefixes
                words.pop(0)
            if words[:2] == ["python", "-m"]:
                commands.append(words[2:4] if words[2] in ("pretrain", "data_prep") else words[2:3])
    return commands


def test_the_readme_is_at_most_150_lines():
    assert len(README.splitlines()) <= 150


def test_the_readme_holds_no_history():
    for word in ("Session", "session ", "issue ", "Issue "):
        assert word not in README, word


@pytest.mark.parametrize("command", _shown_commands(), ids=" ".join)
def test_every_command_the_readme_shows_answers_its_help(command):
    proc = subprocess.run([sys.executable, "-m", *command, "--help"], cwd=REPO, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=300)
    assert proc.returncode == 0 and "usage" in proc.stdout.lower(), proc.stderr[-2000:]


def test_every_launcher_the_readme_shows_exists():
    for script in re.findall(r"\bbash (slurm/\S+\.sh)", README):
        assert (REPO / script).is_file(), script


def test_the_demo_table_is_the_stored_demo_results():
    assert readme_demo_table.readme_table(README) == readme_demo_table.stored_table()
