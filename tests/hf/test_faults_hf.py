"""Regression tests for the HF faults of issue 14 (cases 4, 6a, 6c-e, 7) and the non-RoPE refusal.

Runtime ~60 s (two tiny in-process trainings, a tokenizer, one `python -m pretrain` subprocess).
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))

from hf_helpers import auto_model, megatron_logits, megatron_model, sample_tokens, save_hf_llama  # noqa: E402
from hf_save_checkpoint import tiny_config, train_and_save  # noqa: E402
from megatron_ext.positions import RopeScaling  # noqa: E402
from pretrain.evaluation.scorers import MegatronScorer, RunInfo  # noqa: E402
from pretrain.evaluation.scorer_loading import load_scorer  # noqa: E402
from pretrain.hf import scaled_positions_forward  # noqa: E402
from pretrain.hf.export import export_checkpoint, export_cli  # noqa: E402
from pretrain.hf.importer import import_hf  # noqa: E402
from pretrain.hf.tokenizer import TOKENIZER_FILES  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def run_pretrain(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    """`python -m pretrain ARGS` in a fresh single process."""
    env = dict(os.environ, PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="")
    return subprocess.run([sys.executable, "-m", "pretrain", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


def snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def spm_model(tmp_path_factory):
    """A 500-piece SentencePiece BPE model (<unk>=0, <s>=1, </s>=2) trained on the embedded corpus."""
    from data_prep.corpus import write_embedded_corpus
    from data_prep.train_tokenizer import train_tokenizer

    root = tmp_path_factory.mktemp("spm")
    write_embedded_corpus(str(root / "corpus"), max_bytes=150_000)
    return train_tokenizer([str(root / "corpus")], str(root / "spm"), "sentencepiece-bpe", 500,
                           sample_bytes=150_000)


@pytest.fixture(scope="module")
def hf_llama_dir(tmp_path_factory, spm_model):
    return save_hf_llama(tmp_path_factory.mktemp("llama"), spm_model)


@pytest.fixture(scope="module")
def checkpoints(megatron_world, tmp_path_factory):
    root = tmp_path_factory.mktemp("fault_checkpoints")
    return {"posaug": train_and_save(tiny_config(str(root / "posaug"), groups=2, untied=False)),
            "rfs": train_and_save(tiny_config(str(root / "rfs"), groups=2, untied=False,
                                              positions={"strategy": "rfs", "max_position": 100}))}


# --- case 4 / 7: import-hf --overwrite with a truncated safetensors file


def test_truncated_safetensors_on_import_exits_2_naming_the_file_and_keeps_the_old_run(megatron_world, hf_llama_dir,
                                                                                     tmp_path):
    import_hf(hf_llama_dir, tmp_path / "run")
    before = snapshot(tmp_path / "run")
    bad = tmp_path / "bad"
    bad.mkdir()
    for item in hf_llama_dir.iterdir():
        (bad / item.name).write_bytes(item.read_bytes())
    weights = (hf_llama_dir / "model.safetensors").read_bytes()
    (bad / "model.safetensors").write_bytes(weights[: len(weights) // 2])

    proc = run_pretrain("import-hf", "--hf", str(bad), "--output", str(tmp_path / "run"), "--overwrite")

    errors = [line for line in proc.stderr.splitlines() if line.startswith("import-hf: error:")]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(errors) == 1 and str(bad / "model.safetensors") in errors[0] and "download it again" in errors[0]
    assert snapshot(tmp_path / "run") == before
    assert not (tmp_path / "run.tmp-import").exists()


# --- case 6a: dynamic-NTK HF scoring independent of the call history / batch size


def test_dynamic_ntk_hf_scores_are_equal_on_every_call_and_batch_size(checkpoints, tmp_path):
    export_checkpoint(checkpoints["posaug"], tmp_path / "hf", no_tokenizer=True, rope_scaling="dynamic_ntk",
                      factor=2.0)
    scorer = load_scorer(tmp_path / "hf", backend="hf", train_window=32)
    tokens = sample_tokens(96, seed=6, batch=4)
    first, second = scorer.token_losses(tokens), scorer.token_losses(tokens)
    halves = torch.cat([scorer.token_losses(tokens[:2]), scorer.token_losses(tokens[2:])])
    torch.testing.assert_close(second, first, atol=1e-5, rtol=0)
    torch.testing.assert_close(halves, first, atol=1e-5, rtol=0)
    model, config = megatron_model(checkpoints["posaug"])
    megatron = MegatronScorer(model, config.model, RunInfo(name="m", train_window=32),
                              rope_scaling=RopeScaling(kind="dynamic_ntk", factor=2.0,
                                                       original_max_position_embeddings=32))
    torch.testing.assert_close(first, megatron.token_losses(tokens), atol=1e-4, rtol=0)


# --- case 6c: RFS exports carry a requested evaluation length, never a factor < 1


def test_rfs_export_below_the_rfs_range_is_refused_with_the_length_to_use(checkpoints, tmp_path, capsys):
    code = export_cli([checkpoints["rfs"], "--output", str(tmp_path / "hf"), "--no-tokenizer",
                       "--eval-length", "64"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--eval-length 100" in err
    assert not (tmp_path / "hf").exists()


def test_rfs_model_card_states_the_evaluation_length(checkpoints, tmp_path):
    export_checkpoint(checkpoints["rfs"], tmp_path / "hf", no_tokenizer=True)
    card = (tmp_path / "hf" / "README.md").read_text()
    assert "evaluation length n_eval = 256 (default: window × 8)" in card and "factor 2.56" in card


# --- case 6d: import -> export keeps the tokenizer bit for bit


def test_import_then_export_keeps_tokenizer_files_and_special_token_ids_bit_for_bit(megatron_world, hf_llama_dir,
                                                                                   tmp_path):
    from transformers import AutoTokenizer

    import_hf(hf_llama_dir, tmp_path / "run")
    assert export_cli([str(tmp_path / "run"), "--output", str(tmp_path / "hf")]) == 0
    names = [n for n in TOKENIZER_FILES if (hf_llama_dir / n).is_file()]
    assert "tokenizer.model" in names
    assert [n for n in TOKENIZER_FILES if (tmp_path / "hf" / n).is_file()] == names
    assert all((hf_llama_dir / n).read_bytes() == (tmp_path / "hf" / n).read_bytes()
               for n in [*names, "generation_config.json"])
    original, exported = (json.loads((p / "config.json").read_text()) for p in (hf_llama_dir, tmp_path / "hf"))
    ids = ("bos_token_id", "eos_token_id", "pad_token_id")
    assert {k: original.get(k) for k in ids} == {k: exported.get(k) for k in ids}
    a, b = AutoTokenizer.from_pretrained(hf_llama_dir), AutoTokenizer.from_pretrained(tmp_path / "hf")
    for text in ["<s>Hello world</s>", "a <unk> b </s><s> c", "plain text, no specials"]:
        assert a(text)["input_ids"] == b(text)["input_ids"], text
    assert (a.bos_token, a.eos_token, a.unk_token) == (b.bos_token, b.eos_token, b.unk_token)


def test_export_with_an_hf_tokenizer_directory_ships_its_files_unchanged(checkpoints, hf_llama_dir, tmp_path):
    # How a model fine-tuned from an import (a new run dir) gets the original tokenizer back.
    assert export_cli([checkpoints["posaug"], "--output", str(tmp_path / "hf"),
                       "--tokenizer", str(hf_llama_dir)]) == 0
    names = [n for n in TOKENIZER_FILES if (hf_llama_dir / n).is_file()]
    assert all((hf_llama_dir / n).read_bytes() == (tmp_path / "hf" / n).read_bytes() for n in names)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"]) == (1, 2)


# --- case 6e: scaled positions through the HF model


def test_scaled_positions_forward_equals_megatron_logits_at_posaug_positions(checkpoints, tmp_path):
    export_checkpoint(checkpoints["posaug"], tmp_path / "hf", no_tokenizer=True)
    hf, (model, _) = auto_model(tmp_path / "hf"), megatron_model(checkpoints["posaug"])
    tokens = sample_tokens(48, seed=7)
    for alpha in (0.37, 2.5):
        positions = alpha * torch.arange(48, dtype=torch.float32)
        with torch.no_grad():
            logits = scaled_positions_forward(hf, tokens, positions).logits
        torch.testing.assert_close(logits, megatron_logits(model, tokens, positions), atol=1e-4, rtol=0)


def test_float_positions_without_an_attention_mask_are_read_as_packed_sequences(checkpoints, tmp_path):
    # Why scaled_positions_forward exists: transformers masks across every position gap != 1.
    export_checkpoint(checkpoints["posaug"], tmp_path / "hf", no_tokenizer=True)
    hf, (model, _) = auto_model(tmp_path / "hf"), megatron_model(checkpoints["posaug"])
    tokens, positions = sample_tokens(48, seed=7), 0.5 * torch.arange(48, dtype=torch.float32)
    with torch.no_grad():
        unmasked = hf(input_ids=tokens, position_ids=positions[None].expand(2, -1), use_cache=False).logits
    assert (unmasked - megatron_logits(model, tokens, positions)).abs().max() > 1e-2


def test_model_card_snippet_calls_the_model_at_scaled_positions(checkpoints, tmp_path):
    export_checkpoint(checkpoints["posaug"], tmp_path / "hf", no_tokenizer=True)
    card = (tmp_path / "hf" / "README.md").read_text()
    section = card[card.index("## Calling the model at scaled"):]
    snippet = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    namespace = {"torch": torch, "model": auto_model(tmp_path / "hf"), "input_ids": sample_tokens(48, seed=8)}
    exec(snippet, namespace)  # noqa: S102 - the card's own example, run as a user would
    model, _ = megatron_model(checkpoints["posaug"])
    expected = megatron_logits(model, namespace["input_ids"], 0.5 * torch.arange(48, dtype=torch.float32))
    torch.testing.assert_close(namespace["out"].logits, expected, atol=1e-4, rtol=0)


# --- position encodings HF Llama cannot express


@pytest.mark.parametrize("kind", ["alibi", "none"])
def test_export_refuses_a_model_whose_position_embedding_is_not_rope(checkpoints, tmp_path, capsys, kind):
    run = tmp_path / "run"
    shutil.copytree(Path(checkpoints["posaug"]).parent, run)
    state_file = next(run.glob("iter_*/train_state.json"))
    state = json.loads(state_file.read_text())
    state["config"]["model"]["position_embedding_type"] = kind
    state_file.write_text(json.dumps(state))
    code = export_cli([str(run), "--output", str(tmp_path / "hf"), "--no-tokenizer"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"position_embedding_type={kind!r}" in err and "needs rope" in err
    assert not (tmp_path / "hf").exists()
