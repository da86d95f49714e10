"""tests/signal_guard.py: a disposition a test leaves changed is restored before the next test, and the test named."""

import os
import subprocess
import sys
import textwrap

from conftest import REPO

MODULE = """
    import signal
    def test_leaves_sigint_ignored():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    def test_the_next_test_has_the_default_handler():
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
"""


def test_a_test_that_leaves_sigint_ignored_is_named_and_the_next_one_runs_with_the_default(tmp_path):
    (tmp_path / "test_leak.py").write_text(textwrap.dedent(MODULE))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest",
                           "--rootdir", str(tmp_path), str(tmp_path)], cwd=tmp_path, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=f"{REPO / 'tests'}:{REPO}"), timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "test_leak.py::test_leaves_sigint_ignored: left SIGINT as <Handlers.SIG_IGN: 1>" in proc.stdout
