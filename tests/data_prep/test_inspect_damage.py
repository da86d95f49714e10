"""`data_prep inspect` finds content damage that keeps every file's size (bytes overwritten, an index zeroed)
through the manifest's checksums and reports it without a traceback (exit 1). Real CLI runs, ~5 s each."""

import os
import shutil
import subprocess
import sys

import pytest

from conftest import REPO


@pytest.fixture
def shards(tiny_shards, tmp_path):
    """A private copy of the tiny data_prep output, to damage."""
    source = os.path.dirname(tiny_shards)
    shutil.copytree(source, tmp_path / "shards")
    return str(tmp_path / "shards" / os.path.basename(tiny_shards))


def inspect(prefix):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "data_prep", "inspect", prefix], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def overwrite(path, offset, data):
    with open(path, "r+b") as handle:
        handle.seek(offset)
        handle.write(data)


def test_intact_shards_are_consistent(shards):
    proc = inspect(shards)
    assert proc.returncode == 0 and "all shards consistent" in proc.stdout, proc.stdout + proc.stderr


def test_a_zeroed_index_is_reported_without_a_traceback(shards):
    index = f"{shards}_00000_text_document.idx"
    overwrite(index, 0, bytes(os.path.getsize(index)))
    proc = inspect(shards)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr
    assert f"PROBLEM: {index} unreadable: not a Megatron index" in proc.stdout


def test_bytes_overwritten_in_a_bin_are_caught_by_the_manifest_checksums(shards):
    data = f"{shards}_00001_text_document.bin"
    size = os.path.getsize(data)
    overwrite(data, size // 2, b"\xff\xff\xff\xff")
    assert os.path.getsize(data) == size
    proc = inspect(shards)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    assert f"PROBLEM: {shards}_00001_text_document: checksums differ from the manifest" in proc.stdout
