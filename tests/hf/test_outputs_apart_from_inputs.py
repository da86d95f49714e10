"""No command that writes may write over what it reads: an output equal to, inside or containing one of its
inputs is refused in one line (exit 2) before anything is touched, --overwrite or not.

Real CLI processes; each refusal comes before any model is loaded, so the inputs here are the shapes the
commands check first (a run directory with an intact iter_* record, an HF directory), ~5 s each."""

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, file_hashes


def cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="")
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    """The one error line of a refusal (exit 2, no traceback), whichever command prefix it carries."""
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, proc.stderr[-3000:]
    return errors[0]


@pytest.fixture
def run_dir(tmp_path):
    """A run directory as `train` leaves it: an intact (empty) checkpoint record, config and TensorBoard files."""
    run = tmp_path / "runs" / "run"
    (run / "iter_0000002").mkdir(parents=True)
    (run / "iter_0000002" / "train_state.json").write_text(json.dumps({"iteration": 2, "files": {}}))
    (run / "latest_checkpointed_iteration.txt").write_text("2")
    (run / "config.yaml").write_text("name: run\n")
    (run / "tensorboard").mkdir()
    (run / "tensorboard" / "events.out").write_bytes(b"events")
    return run


@pytest.mark.parametrize("where", ["the run", "its iter dir", "the run's parent", "inside the run"])
def test_export_hf_refuses_an_output_overlapping_the_checkpoint_and_keeps_the_run(run_dir, where):
    output = {"the run": run_dir, "its iter dir": run_dir / "iter_0000002", "the run's parent": run_dir.parent,
              "inside the run": run_dir / "hf"}[where]
    before = file_hashes(run_dir.parent)
    line = one_error_line(cli("pretrain", "export-hf", str(run_dir), "--output", str(output),
                              "--overwrite", "--no-tokenizer"))
    assert f"--output {output}" in line and ("--checkpoint" in line or "run directory" in line), line
    assert file_hashes(run_dir.parent) == before


def test_import_hf_refuses_to_write_over_its_source_model(tmp_path):
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (hf / "model.safetensors").write_bytes(b"weights")
    before = file_hashes(hf)
    line = one_error_line(cli("pretrain", "import-hf", "--hf", str(hf), "--output", str(hf), "--overwrite"))
    assert f"--output {hf} is --hf {hf} itself" in line
    assert file_hashes(hf) == before


def test_eval_refuses_an_out_directory_inside_the_model_it_scores(run_dir, tmp_path):
    text = tmp_path / "eval.txt"
    text.write_text("some text " * 20)
    line = one_error_line(cli("pretrain", "eval", "run", str(run_dir), "--data", str(text), "--lengths", "32",
                              "--output", str(run_dir / "iter_0000002")))
    assert "--out" in line and "inside MODEL" in line


def test_data_prep_build_refuses_shards_written_into_its_input_directory(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("hello world\n")
    line = one_error_line(cli("data_prep", "build", "--input", str(corpus), "--tokenizer", str(tmp_path / "tok.json"),
                              "--data-prefix", str(corpus / "shards")))
    assert f"--data-prefix {corpus / 'shards'} is inside --input {corpus}" in line
    assert sorted(p.name for p in corpus.iterdir()) == ["a.txt"]
