"""A test that leaves this pytest process's SIGINT or SIGTERM disposition changed has it restored after it, and is
named at the end of the run.

Why: the process's later tests would run with it, and every process they exec inherits an ignored signal (exec
keeps SIG_IGN), so a Ctrl-C test three modules later fails for a reason it cannot show. The names are collected in
a file (LEAKS_ENV) because xdist workers print no summary of their own.
"""

from __future__ import annotations

import os
import signal
import tempfile

import pytest

GUARDED = (signal.SIGINT, signal.SIGTERM)
LEAKS_ENV = "POSAUG_SIGNAL_LEAKS"


def pytest_configure(config):
    """SIGINT as under a terminal; the controller (not an xdist worker) names the file every worker appends to: its
    own, even in a test's run."""
    # A shell starts a background job (`make test &`, nohup, CI runners) with SIGINT ignored, and exec passes that on
    # to every process a test starts: their Ctrl-C tests would then test nothing. A terminal's run has the default.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if not hasattr(config, "workerinput"):
        fd, path = tempfile.mkstemp(prefix="posaug_signal_leaks_")
        os.close(fd)
        os.environ[LEAKS_ENV] = path
        config._posaug_signal_leaks = path


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Restore what the test changed; note who changed it."""
    before = {number: signal.getsignal(number) for number in GUARDED}
    try:
        return (yield)
    finally:
        for number, handler in before.items():
            now = signal.getsignal(number)
            if now != handler and handler is not None:
                signal.signal(number, handler)
                with open(os.environ[LEAKS_ENV], "a") as leaks:
                    leaks.write(f"{item.nodeid}: left {signal.Signals(number).name} as {now!r}\n")


def pytest_terminal_summary(terminalreporter, config):
    """Name the tests that changed a disposition (restored after each)."""
    path = getattr(config, "_posaug_signal_leaks", None)
    if path and os.path.getsize(path):
        terminalreporter.section("signal dispositions changed by a test (restored after it)")
        terminalreporter.write(open(path).read())


def pytest_unconfigure(config):
    """Remove the controller's file."""
    path = getattr(config, "_posaug_signal_leaks", None)
    if path:
        os.unlink(path)
        os.environ.pop(LEAKS_ENV, None)
