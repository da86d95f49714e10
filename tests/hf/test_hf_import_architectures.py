"""import-hf of every supported architecture is exact; every other one is refused in one line.

Small random Llama, Llama-3 (llama3 rope_scaling), Qwen2 (q/k/v biases) and Mistral (no sliding
window) models are built and saved by transformers itself with every parameter non-zero (biases
N(0, 0.5), norm weights 1 + N(0, 0.2)), so a dropped bias, norm or scaling shows in the logits.
Runtime ~1.5 min (the TP=2 imports run in one torchrun launch; four 2-step fine-tunes).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))

from conftest import REPO, run_torchrun  # noqa: E402
from hf_helpers import (ARCH_VOCAB, ARCHITECTURES, LLAMA3_ROPE, auto_model, megatron_model,  # noqa: E402
                        read_config, save_random_hf, transformers_warnings)
from pretrain.hf.export import export_checkpoint, export_cli  # noqa: E402
from pretrain.hf.importer import SUPPORTED, import_cli, import_hf  # noqa: E402

LENGTH = 96  # beyond the llama3 model's original_max_position_embeddings (32)
ALPHAS = (1.0, 1.7, 0.6)  # PosAug-style float positions α·i, fed to HF as position_ids
ARCHS = list(ARCHITECTURES)


def tokens_for_test(seed=0):
    return torch.randint(0, ARCH_VOCAB, (2, LENGTH), generator=torch.Generator().manual_seed(seed))


def position_rows():
    return torch.stack([torch.arange(LENGTH, dtype=torch.float32) * alpha for alpha in ALPHAS])


def hf_logits_at(model, tokens, positions):
    """HF logits with float position_ids (the explicit mask keeps them from reading as packed sequences)."""
    with torch.no_grad():
        return model(input_ids=tokens, position_ids=positions[None].expand(tokens.shape[0], -1),
                     attention_mask=torch.ones_like(tokens)).logits


def ours_at(model, tokens, positions):
    with torch.no_grad():
        return model(tokens, positions, None)[..., :ARCH_VOCAB]


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf_archs")
    return {arch: save_random_hf(root / arch, arch) for arch in ARCHS}


@pytest.fixture(scope="module")
def imported(megatron_world, hf_dirs, tmp_path_factory):
    """{arch: run dir} imported at TP=1 in this process."""
    root = tmp_path_factory.mktemp("imported")
    return {arch: import_hf(hf_dirs[arch], root / arch) for arch in ARCHS}


@pytest.mark.parametrize("arch", ARCHS)
def test_test_models_have_every_parameter_nonzero_and_norms_not_one(hf_dirs, arch):
    from pretrain.hf.importer import read_hf_weights

    weights = read_hf_weights(hf_dirs[arch])
    assert all(bool((t != 0).all()) for t in weights.values())
    assert all(not torch.allclose(t, torch.ones_like(t)) for name, t in weights.items() if "norm" in name)
    assert any(name.endswith("q_proj.bias") for name in weights) == (arch == "qwen2")


@pytest.mark.parametrize("arch", ARCHS)
def test_imported_logits_equal_hf_logits_at_float_positions(hf_dirs, imported, arch):
    model, _ = megatron_model(imported[arch])
    hf = auto_model(hf_dirs[arch])
    tokens = tokens_for_test()
    for positions in position_rows():
        torch.testing.assert_close(ours_at(model, tokens, positions), hf_logits_at(hf, tokens, positions),
                                   atol=2e-5, rtol=0)


def test_imported_model_config_carries_the_architecture(imported):
    configs = {arch: megatron_model(run)[1].model for arch, run in imported.items()}
    assert [arch for arch, m in configs.items() if m.add_qkv_bias] == ["qwen2"]
    assert [arch for arch, m in configs.items() if m.use_rope_scaling] == ["llama3"]
    llama3 = configs["llama3"]
    assert (llama3.rope_scaling_factor, llama3.rope_scaling_low_freq_factor, llama3.rope_scaling_high_freq_factor,
            llama3.rope_scaling_original_max_position_embeddings) == (4.0, 1.0, 4.0, 32)


def test_llama3_scaling_changes_the_logits_beyond_the_original_window(hf_dirs, imported):
    # The llama and llama3 test models share their weights: only the RoPE scaling differs.
    tokens = tokens_for_test()
    positions = torch.arange(LENGTH, dtype=torch.float32)
    plain, scaled = (ours_at(megatron_model(imported[a])[0], tokens, positions) for a in ("llama", "llama3"))
    assert (plain - scaled).abs().max() > 1e-2


@pytest.mark.parametrize("arch", ARCHS)
def test_export_of_an_import_gives_the_hf_logits_again(hf_dirs, imported, tmp_path, arch):
    export_checkpoint(imported[arch], tmp_path / "hf", no_tokenizer=True)
    with transformers_warnings() as messages:
        exported = auto_model(tmp_path / "hf")
    assert messages == []
    tokens = tokens_for_test(seed=1)
    original = auto_model(hf_dirs[arch])
    for positions in position_rows():
        torch.testing.assert_close(hf_logits_at(exported, tokens, positions), hf_logits_at(original, tokens, positions),
                                   atol=2e-5, rtol=0)
    config = read_config(tmp_path / "hf")
    assert config["model_type"] == ("qwen2" if arch == "qwen2" else "llama")
    expected = LLAMA3_ROPE if arch == "llama3" else {"rope_type": "default", "rope_theta": config["rope_theta"]}
    assert config["rope_parameters"] == expected
    assert config["rope_scaling"] == ({k: v for k, v in LLAMA3_ROPE.items() if k != "rope_theta"}
                                      if arch == "llama3" else None)


@pytest.mark.slow
def test_tensor_parallel_imports_give_the_hf_logits_train_and_export_back(megatron_world, hf_dirs, tmp_path):
    tokens, positions = tokens_for_test(seed=2), position_rows()
    torch.save(tokens, tmp_path / "tokens.pt")
    torch.save(positions, tmp_path / "positions.pt")
    pairs = [f"{hf_dirs[arch]}:{tmp_path / arch}" for arch in ARCHS]
    records = run_torchrun("tests/distributed/hf_import_logits.py", 2, "--tokens", str(tmp_path / "tokens.pt"),
                           "--positions", str(tmp_path / "positions.pt"), "--out", str(tmp_path / "logits.pt"),
                           "--train-steps", "2", *pairs, timeout=300)
    assert [r["tp"] for r in records] == [2] * len(ARCHS)
    logits = torch.load(tmp_path / "logits.pt")
    for arch, record in zip(ARCHS, records):
        hf = auto_model(hf_dirs[arch])
        # the TP=2 checkpoint, resharded to one process by export-hf, is the HF model again
        exported = auto_model(export_checkpoint(tmp_path / arch, tmp_path / f"hf_{arch}", no_tokenizer=True))
        # and PosAug steps at TP=2 train every imported tensor (Qwen2's biases too), exported exactly
        tuned, _ = megatron_model(record["tuned"])
        before = megatron_model(tmp_path / arch)[0].state_dict()
        unchanged = [k for k, v in tuned.state_dict().items() if torch.is_tensor(v) and "_extra_state" not in k
                     and torch.equal(v, before[k])]
        assert unchanged == []
        assert any(k.endswith("linear_qkv.bias") for k in before) == (arch == "qwen2")
        tuned_hf = auto_model(export_checkpoint(record["tuned"], tmp_path / f"tuned_{arch}", no_tokenizer=True))
        for row, row_positions in enumerate(positions):
            expected = hf_logits_at(hf, tokens, row_positions)
            torch.testing.assert_close(logits[str(hf_dirs[arch])][row], expected, atol=2e-5, rtol=0,
                                       msg=lambda m: f"{arch}, positions row {row}: {m}")
            torch.testing.assert_close(hf_logits_at(exported, tokens, row_positions), expected, atol=2e-5, rtol=0)
            torch.testing.assert_close(hf_logits_at(tuned_hf, tokens, row_positions),
                                       ours_at(tuned, tokens, row_positions), atol=2e-5, rtol=0)


def _fine_tune(run_dir, save_dir):
    env = dict(os.environ, PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="")
    overrides = [f"checkpoint.load={run_dir}", f"checkpoint.save={save_dir}", "positions.strategy=posaug",
                 "data.synthetic=true", "schedule.train_iters=2", "schedule.global_batch_size=2",
                 "schedule.micro_batch_size=1", "optimizer.lr=1e-2", "optimizer.lr_warmup_iters=0",
                 "logging.eval_interval=100"]
    command = [sys.executable, "-m", "pretrain", "train", "--config", str(Path(run_dir) / "config.yaml")]
    for item in overrides:
        command += ["--set", item]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_posaug_fine_tune_from_an_import_trains_and_exports_exactly(imported, tmp_path, arch):
    proc = _fine_tune(imported[arch], tmp_path / "tuned")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "step 2/2" in proc.stdout and "α" in proc.stdout
    tuned, config = megatron_model(tmp_path / "tuned")
    before, imported_config = megatron_model(imported[arch])
    assert config.positions.strategy == "posaug" and config.model == imported_config.model
    tuned_state, before_state = tuned.state_dict(), before.state_dict()
    changed = {k for k, v in tuned_state.items() if torch.is_tensor(v) and "_extra_state" not in k
               and not torch.equal(v, before_state[k])}
    assert any(k.endswith("linear_qkv.bias") for k in changed) == (arch == "qwen2")
    export_checkpoint(tmp_path / "tuned", tmp_path / "hf", no_tokenizer=True)
    tokens = tokens_for_test(seed=3)
    for positions in position_rows():
        torch.testing.assert_close(hf_logits_at(auto_model(tmp_path / "hf"), tokens, positions),
                                   ours_at(tuned, tokens, positions), atol=2e-5, rtol=0)
    assert read_config(tmp_path / "hf")["rope_parameters"]["rope_type"] == ("llama3" if arch == "llama3" else "default")


@pytest.mark.parametrize("arch", ["llama3", "qwen2"])
def test_imported_model_evaluates_the_same_through_both_backends(imported, arch):
    from pretrain.evaluation.scorer_loading import load_scorer

    tokens = tokens_for_test(seed=4)
    megatron = load_scorer(imported[arch], backend="megatron").token_losses(tokens)
    hf = load_scorer(imported[arch], backend="hf").token_losses(tokens)
    torch.testing.assert_close(megatron, hf, atol=2e-5, rtol=0)


def test_hf_directory_with_llama3_scaling_refuses_an_evaluation_override(hf_dirs):
    from pretrain.evaluation.scorer_loading import load_scorer

    with pytest.raises(ValueError, match="already carries RoPE scaling 'llama3'"):
        load_scorer(hf_dirs["llama3"], train_window=32, rope_scaling="yarn", factor=2.0)


def test_llama3_model_refuses_a_second_rope_scaling_at_export_and_evaluation(imported, tmp_path, capsys):
    from pretrain.evaluation.scorer_loading import load_scorer

    assert export_cli([str(imported["llama3"]), "--output", str(tmp_path / "hf"), "--no-tokenizer",
                       "--rope-scaling", "yarn", "--factor", "2"]) == 2
    assert "one rope type" in capsys.readouterr().err and not (tmp_path / "hf").exists()
    with pytest.raises(ValueError, match="model.use_rope_scaling"):
        load_scorer(imported["llama3"], backend="megatron", rope_scaling="pi", factor=2.0)


def test_llama3_model_refuses_random_base_positions(hf_dirs, tmp_path, capsys):
    args = ["--hf", str(hf_dirs["llama3"]), "--output", str(tmp_path / "run"), "--set", "positions.strategy=random_base"]
    assert import_cli(args) == 2
    assert "random_base" in capsys.readouterr().err and not (tmp_path / "run").exists()


# ------------------------------------------------------------------------------------------ refusals

def _config(class_name, **fields):
    import transformers

    return getattr(transformers, class_name)(**fields)


SMALL = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
             bos_token_id=None, eos_token_id=None, pad_token_id=None)
# name -> (config builder, words the one-line refusal must contain)
REFUSED = {
    "gpt2": (lambda: _config("GPT2Config", vocab_size=64, n_embd=32, n_layer=1, n_head=2, n_positions=64,
                                     bos_token_id=None, eos_token_id=None),
             ["'gpt2'", "learned absolute position embeddings", "LayerNorm"]),
    "gemma": (lambda: _config("GemmaConfig", **SMALL, head_dim=16), ["'gemma'", "GELU", "+1 weight offset"]),
    "olmo2": (lambda: _config("Olmo2Config", **SMALL), ["'olmo2'", "QK-norm"]),
    "phi3": (lambda: _config("Phi3Config", **SMALL), ["'phi3'", "fused qkv_proj and gate_up_proj"]),
    "mistral_sliding_window": (lambda: _config("MistralConfig", **SMALL, sliding_window=16),
                               ["'mistral'", "sliding-window attention", "sliding_window=16"]),
    "qwen2_sliding_window": (lambda: _config("Qwen2Config", **SMALL, use_sliding_window=True, sliding_window=16,
                                             max_window_layers=0), ["'qwen2'", "sliding-window attention"]),
    "llama_longrope": (lambda: _config("LlamaConfig", **SMALL, max_position_embeddings=64, rope_parameters={
        "rope_type": "longrope", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16,
        "short_factor": [1.0] * 8, "long_factor": [2.0] * 8}), ["'llama'", "longrope", "not implemented",
                                                                 "no sequence length to switch on"]),
    "llama_yarn": (lambda: _config("LlamaConfig", **SMALL, max_position_embeddings=64, rope_parameters={
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16}),
        ["'llama'", "rope_type 'yarn'"]),
    "llama_attention_bias": (lambda: _config("LlamaConfig", **SMALL, attention_bias=True),
                             ["'llama'", "attention_bias"]),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_unsupported_architecture_is_refused_in_one_line_naming_type_feature_and_supported(name, tmp_path,
                                                                                             capsys):
    from transformers import AutoModelForCausalLM

    build, words = REFUSED[name]
    AutoModelForCausalLM.from_config(build()).save_pretrained(tmp_path / "hf")
    capsys.readouterr()  # transformers' save progress bar
    assert import_cli(["--hf", str(tmp_path / "hf"), "--output", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("import-hf: error: cannot import model_type ")
    for word in [*words, "; supported: "] + [f"{kind} (" for kind in SUPPORTED]:
        assert word in err, (word, err)
    assert not (tmp_path / "run").exists()


def test_gpt2_from_the_command_line_is_one_error_line_with_exit_2(tmp_path):
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_config(REFUSED["gpt2"][0]()).save_pretrained(tmp_path / "hf")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "pretrain", "import-hf", "--hf", str(tmp_path / "hf"), "--output",
                           str(tmp_path / "run")], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert [line for line in proc.stderr.splitlines() if "error" in line] == [proc.stderr.strip()]
    assert "'gpt2'" in proc.stderr and "supported: llama" in proc.stderr


def test_hf_tensors_the_config_does_not_declare_are_refused(hf_dirs, tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    (tmp_path / "hf").mkdir()
    weights = load_file(hf_dirs["llama"] / "model.safetensors")
    weights["model.layers.0.self_attn.q_proj.bias"] = torch.ones(64)  # Llama config says attention_bias=false
    save_file(weights, tmp_path / "hf" / "model.safetensors", metadata={"format": "pt"})
    (tmp_path / "hf" / "config.json").write_text((hf_dirs["llama"] / "config.json").read_text())
    assert import_cli(["--hf", str(tmp_path / "hf"), "--output", str(tmp_path / "run")]) == 2
    assert "model.layers.0.self_attn.q_proj.bias" in capsys.readouterr().err and not (tmp_path / "run").exists()


def test_docs_import_table_has_one_row_per_supported_model_type():
    text = (REPO / "docs" / "hf.md").read_text()
    section = text.split("## Importing Hugging Face models", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    assert sorted({row.split("`")[1] for row in rows}) == sorted(SUPPORTED)


def test_llama_3_config_in_the_released_legacy_layout_imports_its_scaling(hf_dirs, tmp_path):
    from pretrain.hf.importer import model_config_from_hf

    config = json.loads((hf_dirs["llama3"] / "config.json").read_text())
    del config["rope_parameters"]  # Llama 3.1's own config.json: rope_theta + rope_scaling
    config.update(rope_theta=500000.0, rope_scaling={"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                     "original_max_position_embeddings": 8192, "rope_type": "llama3"})
    model = model_config_from_hf(config)
    assert (model.rotary_base, model.use_rope_scaling, model.rope_scaling_factor,
            model.rope_scaling_original_max_position_embeddings) == (500000.0, True, 8.0, 8192)


@pytest.mark.parametrize("edit,message", [
    (lambda c: c.pop("num_attention_heads"), "config.json has no num_attention_heads"),
    (lambda c: c["rope_parameters"].pop("low_freq_factor"), "its llama3 rope_scaling has no low_freq_factor"),
    (lambda c: c.pop("model_type"), "config.json names no model_type"),
])
def test_incomplete_config_is_refused_naming_the_missing_field(hf_dirs, tmp_path, capsys, edit, message):
    config = json.loads((hf_dirs["llama3"] / "config.json").read_text())
    edit(config)
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    assert import_cli(["--hf", str(tmp_path / "hf"), "--output", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_config_that_is_not_json_is_refused_naming_the_file(tmp_path, capsys):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{truncated")
    assert import_cli(["--hf", str(tmp_path / "hf"), "--output", str(tmp_path / "run")]) == 2
    assert "config.json is not valid JSON" in capsys.readouterr().err
