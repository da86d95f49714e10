"""Shared fixtures: a single-process Megatron world, and a torchrun launcher with a timeout."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def megatron_world():
    """Megatron parallel state for one gloo process (TP=PP=1), shared by in-process tests."""
    from megatron_ext.model import ParallelConfig
    from pretrain import distributed

    distributed.initialize(ParallelConfig(), seed=1234)
    yield
    distributed.destroy()


def run_torchrun(script: str, nproc: int, *args: str, timeout: float = 300) -> list[dict]:
    """Run `script` under torchrun (gloo, CPU) and return the JSON records printed as 'RESULT {...}'."""
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               str(REPO / script), *args]
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(command)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return [json.loads(line[len("RESULT "):]) for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
