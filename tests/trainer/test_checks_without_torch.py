"""The launchers' pre-flight (`plan --check` and `train --check` in one process, pretrain/preflight.py) starts without
torch or Megatron-Core: a dry run or a submission pays Python's start-up only, once the plan's parameter-shape cache
holds the config (its first build imports Megatron-Core, once per config and version)."""

import os
import subprocess
import sys

from conftest import REPO

# Exec'ed with -c (never forked from the zygote, whose processes hold torch already), as the launcher execs it.
PREFLIGHT = """
import sys
from pretrain.preflight import main
main(sys.argv[1:])
print("imported:", sorted(name for name in ("torch", "megatron", "transformers") if name in sys.modules))
"""


def preflight(results, cache, *plan: str) -> subprocess.CompletedProcess:
    config = str(REPO / "pretrain" / "configs" / "113m_posaug.yaml")
    env = dict(os.environ, WORLD_SIZE="8", PRETRAIN_PLAN_CACHE=str(cache), CUDA_VISIBLE_DEVICES="")
    return subprocess.run([sys.executable, "-c", PREFLIGHT, str(results), *plan, "--train", "--config", config,
                           "--set", "data.synthetic=true"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)


def test_train_check_imports_neither_torch_nor_megatron(tmp_path):
    proc = preflight(tmp_path, tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "preflight.rc").read_text().strip() == "0", (tmp_path / "preflight.out").read_text()
    assert "imported: []" in proc.stdout


def test_the_plan_imports_neither_once_its_parameter_shapes_are_cached(tmp_path):
    config = str(REPO / "pretrain" / "configs" / "113m_posaug.yaml")
    plan = ["--plan", config, "--gpu", "h100-80gb", "--nodes", "1", "--gpus-per-node", "8", "--check"]
    first = preflight(tmp_path, tmp_path / "cache", *plan)  # builds the cache: a Megatron-Core build on meta
    assert first.returncode == 0 and (tmp_path / "plan.rc").read_text().strip() == "0", first.stdout + first.stderr
    again = preflight(tmp_path, tmp_path / "cache", *plan)
    assert again.returncode == 0 and (tmp_path / "plan.rc").read_text().strip() == "0", again.stdout + again.stderr
    assert "imported: []" in again.stdout
