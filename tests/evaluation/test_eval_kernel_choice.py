"""A kernel choice is not part of a checkpoint's identity: a run trained with `model.rope_kernel=triton` (on a GPU)
is evaluated on a CPU with the unfused kernel, saying so in one line, and gives the same numbers as the same weights
recorded with the unfused kernel.

The checkpoint is a real one trained here with the unfused kernel; its recorded config is then rewritten to say
triton, which is what a GPU run's checkpoint holds (the kernel changes no tensor the checkpoint stores)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))

from conftest import REPO, one_error_line  # noqa: E402
from hf_save_checkpoint import tiny_config, train_and_save  # noqa: E402


@pytest.fixture(scope="module")
def runs(megatron_world, tmp_path_factory):
    """(the run as trained, the same run recorded as trained with the Triton kernel)."""
    root = tmp_path_factory.mktemp("kernel_choice")
    unfused = Path(train_and_save(tiny_config(str(root / "unfused"), groups=2, untied=False))).parent
    triton = root / "triton"
    shutil.copytree(unfused, triton)
    for state in triton.glob("iter_*/train_state.json"):
        record = json.loads(state.read_text())
        assert record["config"]["model"]["rope_kernel"] == "auto"
        record["config"]["model"]["rope_kernel"] = "triton"
        state.write_text(json.dumps(record))
    return unfused, triton


def eval_run(run: Path, shards: str, out: Path, *extra: str, command: str = "run") -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="")
    env.pop("TRITON_INTERPRET", None)
    where = [str(run), "--data", shards, "--lengths", "128", "--num-spans", "4"] if command == "run" else [str(run)]
    return subprocess.run([sys.executable, "-m", "pretrain", "eval", command, *where, "--output", str(out), *extra],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow  # two evaluations through the CLI
def test_a_triton_trained_run_is_evaluated_on_cpu_with_a_one_line_note_and_the_same_numbers(runs, tiny_shards,
                                                                                             tmp_path):
    unfused, triton = runs
    as_trained = eval_run(unfused, tiny_shards, tmp_path / "unfused")
    read_here = eval_run(triton, tiny_shards, tmp_path / "triton")
    assert as_trained.returncode == 0 and read_here.returncode == 0, read_here.stderr[-3000:]
    notes = [line for line in read_here.stderr.splitlines() if "rope_kernel=triton" in line]
    assert len(notes) == 1 and notes[0].startswith("note:") and "rope_kernel=auto" in notes[0]
    records = [json.loads(next(Path(tmp_path, name).glob("*.json")).read_text()) for name in ("unfused", "triton")]
    assert records[0]["lengths"] == records[1]["lengths"]


# `eval run` / `eval all` --set (issue 68): the inference-time model fields a reader may choose (a kernel, the
# attention implementation: inference_model.INFERENCE_FIELDS), and none that changes what the weights mean.
@pytest.mark.slow  # two evaluations through the CLI
def test_eval_run_set_rope_kernel_reads_a_triton_run_with_the_chosen_kernel_and_the_same_numbers(runs, tiny_shards,
                                                                                                 tmp_path):
    unfused, triton = runs
    as_trained = eval_run(unfused, tiny_shards, tmp_path / "unfused")
    chosen = eval_run(triton, tiny_shards, tmp_path / "chosen", "--set", "model.rope_kernel=unfused",
                      "model.core_attention=megatron")
    assert as_trained.returncode == 0 and chosen.returncode == 0, chosen.stderr[-3000:]
    notes = [line for line in chosen.stderr.splitlines() if "rope_kernel" in line]
    assert notes == [f"note: reading {triton} with model.core_attention=megatron (recorded: sdpa), "
                     "model.rope_kernel=unfused (recorded: triton)"], chosen.stderr[-3000:]
    records = [json.loads(next(Path(tmp_path, name).glob("*.json")).read_text()) for name in ("unfused", "chosen")]
    for length, entry in records[0]["lengths"].items():  # sdpa and megatron's attention: the same math, in float32
        assert entry["loss"] == pytest.approx(records[1]["lengths"][length]["loss"], abs=1e-5)


@pytest.mark.parametrize("command, key, why", [
    ("run", "model.num_layers=2", "changes what the checkpoint's weights mean"),
    ("run", "model.rotary_base=500000", "changes what the checkpoint's weights mean"),
    ("run", "positions.strategy=none", "is how the run was trained"),
    ("run", "positions.rope_scaling=yarn", "--rope-scaling and --factor"),
    ("all", "model.hidden_size=8", "changes what the checkpoint's weights mean"),
])
def test_eval_set_of_a_field_that_changes_the_weights_meaning_is_refused_in_one_line(runs, tiny_shards, tmp_path,
                                                                                     command, key, why):
    unfused, _ = runs
    line = one_error_line(eval_run(unfused if command == "run" else unfused.parent, tiny_shards, tmp_path / "out",
                                   "--set", key, command=command))
    assert line.startswith(f"error: --set {key.split('=')[0]}") and why in line, line
    assert not (tmp_path / "out").exists()  # refused before anything is read or written


def test_eval_run_set_rope_kernel_triton_without_a_gpu_is_refused_in_one_line(runs, tiny_shards, tmp_path):
    unfused, _ = runs
    line = one_error_line(eval_run(unfused, tiny_shards, tmp_path / "out", "--set", "model.rope_kernel=triton"))
    assert "model.rope_kernel=triton needs a CUDA GPU" in line, line
