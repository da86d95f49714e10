"""BF16 mixed precision end to end on CPU (issue 42): Megatron's Float16 optimizer (bf16 weights, fp32 main params
and grads) trains, saves, resumes bit for bit, falls back from a damaged checkpoint, exports to HF in bf16 and fp32,
evaluates, and starts a bf16 run from imported HF weights.

One 4-step bf16 run of the tiny preset on data_prep shards (checkpoints at 2 and 4) is shared by every test."""

import json
import shutil

import pytest
import torch

from conftest import REPO, TINY_TRAIN, run_train, tensorboard_scalars

pytestmark = [pytest.mark.slow]  # training subprocesses

BF16 = [*TINY_TRAIN, "model.bf16=true", "checkpoint.save_interval=2", "checkpoint.keep_last=5",
        "positions.strategy=posaug"]


def train(data, run_dir, iters, *extra, check=True):
    """The bf16 tiny run in `run_dir` up to `iters` steps (a resume when it holds checkpoints)."""
    return run_train([*BF16, f"data.data_path={data}", f"schedule.train_iters={iters}", f"checkpoint.save={run_dir}",
                      *extra], check=check)


@pytest.fixture(scope="module")
def bf16_run(tiny_shards, tmp_path_factory):
    """Four bf16 steps, checkpoints after steps 2 and 4; (run dir, the CompletedProcess)."""
    run_dir = tmp_path_factory.mktemp("bf16") / "run"
    return run_dir, train(tiny_shards, run_dir, 4)


def safetensors_of(directory):
    from safetensors.torch import load_file

    return {name: tensor for path in sorted(directory.glob("*.safetensors"))
            for name, tensor in load_file(path).items()}


def test_bf16_run_writes_its_checkpoints(bf16_run):
    run_dir, _ = bf16_run
    assert (run_dir / "iter_0000002" / "train_state.json").is_file()
    assert (run_dir / "latest_checkpointed_iteration.txt").read_text() == "4"


def test_bf16_checkpoint_holds_bf16_weights_and_fp32_main_params(bf16_run):
    from torch.distributed.checkpoint import FileSystemReader

    metadata = FileSystemReader(str(bf16_run[0] / "iter_0000004")).read_metadata().state_dict_metadata
    weights = {k: m.properties.dtype for k, m in metadata.items() if not k.startswith("optimizer.")
               and hasattr(m, "properties") and "_extra_state" not in k}
    main = {k: m.properties.dtype for k, m in metadata.items() if k.startswith("optimizer.state.fp32_param.")}
    assert weights and set(weights.values()) == {torch.bfloat16}, weights
    assert len(main) == len(weights) and set(main.values()) == {torch.float32}, main


def test_bf16_training_prints_no_dtype_mismatch_warning(bf16_run):
    output = bf16_run[1].stdout + bf16_run[1].stderr
    assert "Mismatch dtype" not in output and "Warning" not in output, output[-3000:]


def test_bf16_resume_repeats_the_loss_curve_bit_for_bit(bf16_run, tiny_shards, tmp_path):
    shutil.copytree(bf16_run[0] / "iter_0000002", tmp_path / "iter_0000002")
    resumed = train(tiny_shards, tmp_path, 4)
    assert "resumed from iteration 2" in resumed.stdout
    expected, got = tensorboard_scalars(bf16_run[0], "train/loss"), tensorboard_scalars(tmp_path, "train/loss")
    assert [got[step] for step in (3, 4)] == [expected[step] for step in (3, 4)]
    assert tensorboard_scalars(tmp_path, "train/grad_norm")[4] == tensorboard_scalars(bf16_run[0],
                                                                                    "train/grad_norm")[4]


def test_bf16_resume_skips_a_damaged_newest_checkpoint(bf16_run, tiny_shards, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(bf16_run[0], run_dir)
    shard = max((run_dir / "iter_0000004").glob("*.distcp"), key=lambda path: path.stat().st_size)
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    resumed = train(tiny_shards, run_dir, 4)
    assert "skipping" in resumed.stdout and "resumed from iteration 2" in resumed.stdout, resumed.stdout[-2000:]
    expected, got = tensorboard_scalars(bf16_run[0], "train/loss"), tensorboard_scalars(run_dir, "train/loss")
    assert got[4] == expected[4]


@pytest.fixture(scope="module")
def exports(bf16_run, tmp_path_factory):
    """The bf16 run exported to HF in bfloat16 and in float32: {dtype name: directory}."""
    from pretrain.hf.export import export_cli

    root = tmp_path_factory.mktemp("bf16_exports")
    for dtype in ("bfloat16", "float32"):
        assert export_cli([str(bf16_run[0]), "--output", str(root / dtype), "--no-tokenizer",
                           "--dtype", dtype]) == 0
    return {dtype: root / dtype for dtype in ("bfloat16", "float32")}


def test_export_of_a_bf16_run_in_float32_is_the_exact_upcast_of_its_bf16_export(exports):
    bf16, fp32 = safetensors_of(exports["bfloat16"]), safetensors_of(exports["float32"])
    assert sorted(bf16) == sorted(fp32)
    assert {t.dtype for t in bf16.values()} == {torch.bfloat16} and {t.dtype for t in fp32.values()} == {torch.float32}
    for name in bf16:
        assert torch.equal(bf16[name].float(), fp32[name]), name


def test_bf16_export_loads_in_transformers_with_its_dtype(exports):
    from transformers import AutoModelForCausalLM

    config = json.loads((exports["bfloat16"] / "config.json").read_text())
    assert config.get("torch_dtype", config.get("dtype")) == "bfloat16"
    model = AutoModelForCausalLM.from_pretrained(exports["bfloat16"], dtype="auto")
    assert model.dtype == torch.bfloat16
    logits = model(torch.arange(16)[None]).logits
    assert torch.isfinite(logits).all()


def test_eval_of_a_bf16_run_gives_finite_per_position_losses(bf16_run, tiny_shards, tmp_path):
    import subprocess
    import sys

    out = tmp_path / "eval"
    proc = subprocess.run([sys.executable, "-m", "pretrain", "eval", "run", str(bf16_run[0]), "--data", tiny_shards,
                           "--lengths", "32", "--num-spans", "1", "--backend", "megatron", "--output", str(out),
                           "--no-progress"], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env=_env())
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "Mismatch dtype" not in proc.stderr
    losses = _numbers([json.loads(path.read_text()) for path in out.rglob("*.json")])
    assert losses and all(v == v and abs(v) != float("inf") for v in losses)


def test_bf16_run_started_from_imported_hf_weights_keeps_them(exports, tiny_shards, tmp_path):
    """A bf16 run loads the imported weights into its fp32 main params too (else step 1 writes the init back)."""
    from pretrain.hf.export import export_cli

    imported = tmp_path / "imported"
    proc = _pretrain("import-hf", "--hf", str(exports["float32"]), "--output", str(imported), "--seq-length", "32")
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = tmp_path / "run"
    train(tiny_shards, run_dir, 2, f"checkpoint.load={imported}", "optimizer.lr=1e-12", "optimizer.min_lr=0",
          "optimizer.lr_warmup_iters=0")
    assert export_cli([str(run_dir), "--output", str(tmp_path / "hf"), "--no-tokenizer"]) == 0
    before, after = safetensors_of(exports["float32"]), safetensors_of(tmp_path / "hf")
    for name in before:  # an lr of 1e-12 moves no bf16 weight
        assert torch.equal(after[name], before[name]), name


def _env():
    import os

    return dict(os.environ, PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="")


def _pretrain(*args):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "pretrain", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env=_env())


def _numbers(record) -> list[float]:
    """Every float in a JSON record (the eval's per-position losses among them)."""
    if isinstance(record, float):
        return [record]
    if isinstance(record, dict):
        return [v for value in record.values() for v in _numbers(value)]
    if isinstance(record, list):
        return [v for value in record for v in _numbers(value)]
    return []
