"""A run started on the oldest tested megatron-core resumes on the newest one and follows the same loss curve.

Runs in `make test`'s second environment (megatron-core 0.19.2), using the main environment's interpreter
(`.venv`, megatron-core 0.16.1) for the first half: the upgrade a cluster makes between two jobs of one run."""

import importlib.metadata
import os
import shutil
import subprocess

import pytest

from conftest import REPO, TINY_TRAIN, run_train, tensorboard_scalars
from megatron_ext.versions import TESTED_MEGATRON_CORE

OLDEST_PYTHON = REPO / ".venv" / "bin" / "python"
RUN = [*TINY_TRAIN, "data.synthetic=true", "positions.strategy=posaug", "schedule.train_iters=4",
       "checkpoint.save_interval=2", "checkpoint.keep_last=5"]

pytestmark = [
    pytest.mark.slow,  # two tiny trainings (~20 s)
    pytest.mark.skipif(importlib.metadata.version("megatron-core") == TESTED_MEGATRON_CORE[0],
                       reason="runs in the newest megatron-core environment (make test-newest-megatron)"),
]


def _oldest_megatron_core() -> str | None:
    if not OLDEST_PYTHON.exists():
        return None
    return subprocess.run([OLDEST_PYTHON, "-c", "import importlib.metadata as m; print(m.version('megatron-core'))"],
                          capture_output=True, text=True, timeout=60).stdout.strip()


def test_checkpoint_saved_by_the_oldest_tested_megatron_core_resumes_with_the_same_losses(tmp_path):
    assert _oldest_megatron_core() == TESTED_MEGATRON_CORE[0], f"{OLDEST_PYTHON} must hold megatron-core " \
        f"{TESTED_MEGATRON_CORE[0]} (make test builds it first)"
    oldest, upgraded = tmp_path / "oldest", tmp_path / "upgraded"
    env = dict(os.environ, PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="")
    subprocess.run([OLDEST_PYTHON, "-m", "pretrain", "train", "--set", *RUN, f"checkpoint.save={oldest}"],
                   cwd=REPO, env=env, check=True, capture_output=True, timeout=300)
    shutil.copytree(oldest / "iter_0000002", upgraded / "iter_0000002")
    (upgraded / "latest_checkpointed_iteration.txt").write_text("2")
    resumed = run_train([*RUN, f"checkpoint.save={upgraded}"])
    assert "resumed from iteration 2" in resumed.stdout
    expected, got = tensorboard_scalars(oldest, "train/loss"), tensorboard_scalars(upgraded, "train/loss")
    for step in (3, 4):
        assert got[step] == pytest.approx(expected[step], abs=1e-5), step
