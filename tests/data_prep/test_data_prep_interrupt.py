"""Ctrl-C during `data_prep build` (issue 68): the terminal's SIGINT to the whole process group, workers included,
ends the build with one line and exit 130, no KeyboardInterrupt traceback from it or a worker, and every file it
read (corpus, tokenizer) byte-identical. Real builds as processes caught while tokenising; ~10 s each."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO, file_hashes
from test_data_prep_helpers import make_docs, train_bytelevel, write_jsonl


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """(corpus, tokenizer) in one directory: a corpus of ~2.3 MB, long enough to be caught mid-build."""
    root = tmp_path_factory.mktemp("inputs")
    write_jsonl(str(root / "corpus.jsonl"), make_docs(2000, seed=3, min_words=100, max_words=200))
    return root, train_bytelevel(str(root / "tok"))


@pytest.mark.parametrize("workers", [1, 2])  # in-process tokenising, and a pool whose workers get the SIGINT too
def test_ctrl_c_during_a_build_is_one_line_exit_130_and_nothing_it_read_is_changed(inputs, tmp_path, workers):
    root, tokenizer = inputs
    before = file_hashes(root)
    work = tmp_path / ".big_work"
    proc = subprocess.Popen([sys.executable, "-m", "data_prep", "build", "--input", str(root / "corpus.jsonl"),
                             "--tokenizer", tokenizer, "--data-prefix", str(tmp_path / "big"), "--no-progress",
                             "--workers", str(workers), "--chunk-bytes", "100000"], cwd=REPO,
                            env=dict(os.environ, PYTHONPATH=str(REPO)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.time() + 120
    while proc.poll() is None and time.time() < deadline and not (work.is_dir() and any(work.glob("u*"))):
        time.sleep(0.01)  # tokenising has begun: the first unit's work file exists
    assert proc.poll() is None, "the build ended before it could be interrupted"
    os.killpg(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr[-3000:]
    lines = [line for line in stderr.splitlines() if "interrupted" in line]
    assert lines == ["data_prep build: interrupted (Ctrl-C); nothing it read was changed; rerun the same command to "
                     "continue (finished work is kept and resumed)"], stderr[-3000:]
    assert file_hashes(root) == before


def test_after_the_first_ctrl_c_the_ones_that_follow_are_ignored_while_the_build_unwinds():
    # a second Ctrl-C during the pool's and the lock's clean-up would end in a traceback from inside it; sending
    # it at that moment from outside is a race, so the handler is checked directly
    from data_prep.cli import _interrupted

    previous = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(KeyboardInterrupt):
            _interrupted(signal.SIGINT, None)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
