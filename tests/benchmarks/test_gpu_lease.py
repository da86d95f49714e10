"""benchmarks/gpu_lease.py's CPU side: the data folder its lease (and the TE battery) carries is built here by one
command; the lease itself without its data or deadline is refused. The lease runs only on a GPU machine."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO

LEASE = [sys.executable, str(REPO / "benchmarks/gpu_lease.py")]


def test_prepare_data_builds_the_shards_and_tokenizer_the_lease_reads(tmp_path):
    result = subprocess.run([*LEASE, "--prepare-data", "--output", str(tmp_path / ".gpu_data"), "--preset", "cpu-tiny"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    prefix = result.stdout.strip().splitlines()[-1]
    assert prefix == str(tmp_path / ".gpu_data/data/shards/corpus")
    from data_prep.manifest import load_manifest

    assert load_manifest(prefix).num_valid_tokens > 0
    assert (tmp_path / ".gpu_data/data/tokenizer/tokenizer.model").is_file()


def test_the_lease_without_its_data_prefix_is_refused_naming_prepare_data(tmp_path):
    result = subprocess.run([*LEASE, "--output", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "--prepare-data" in result.stderr.splitlines()[-1]
