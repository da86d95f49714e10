"""Two `data_prep build`s into one prefix: the second is refused in one line naming the prefix and the holder's
PID (exit 2) instead of both writing the same `.partial` files; a killed build's lock never blocks the next.

Real builds as processes; the first is frozen (SIGSTOP) once it holds the lock, so the overlap is certain. ~15 s.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO


def build(tiny_shards, prefix, **popen):
    root = Path(tiny_shards).parents[1]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen([sys.executable, "-m", "data_prep", "build", "--input", str(root / "corpus"),
                             "--tokenizer", str(root / "tok"), "--data-prefix", prefix, "--num-shards", "2",
                             "--no-progress"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **popen)


def lock_file(prefix):
    return Path(prefix).parent / f".{Path(prefix).name}_build.lock"


def frozen_holder(tiny_shards, prefix):
    """A build stopped (SIGSTOP) right after it took the lock of `prefix`."""
    first = build(tiny_shards, prefix)
    lock = lock_file(prefix)
    deadline = time.time() + 120
    while not (lock.is_file() and f"PID {first.pid} " in lock.read_text()):
        assert first.poll() is None and time.time() < deadline, "the first build never took the lock"
        time.sleep(0.02)
    os.kill(first.pid, signal.SIGSTOP)
    return first


@pytest.fixture
def prefix(tmp_path):
    return str(tmp_path / "out" / "tiny")


def test_a_second_build_into_a_locked_prefix_exits_2_naming_the_holder(tiny_shards, prefix):
    first = frozen_holder(tiny_shards, prefix)
    try:
        second = build(tiny_shards, prefix)
        _, err = second.communicate(timeout=120)
    finally:
        os.kill(first.pid, signal.SIGCONT)
    assert second.returncode == 2 and "Traceback" not in err, err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and f"--data-prefix {prefix}: another data_prep build is writing it (PID {first.pid} " \
        in errors[0] and "another --data-prefix" in errors[0], err
    assert first.wait(timeout=120) == 0, first.stderr.read()  # the holder finishes undisturbed
    assert Path(prefix + "_manifest.json").is_file()


def test_a_killed_builds_lock_does_not_block_the_next_build(tiny_shards, prefix):
    first = frozen_holder(tiny_shards, prefix)
    first.kill()
    first.wait(timeout=30)
    assert f"PID {first.pid} " in lock_file(prefix).read_text()  # its line stays; the lock does not
    second = build(tiny_shards, prefix)
    _, err = second.communicate(timeout=180)
    assert second.returncode == 0, err
