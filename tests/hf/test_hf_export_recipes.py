"""Exports of the long-context recipes: QK-norm (± sliding-window layers) as Qwen3, sliding-window layers alone as
Qwen2, logits equal to ours; sinks, a per-kind RoPE base and NoPE beside them refused in one line each."""

import dataclasses
import json
import sys
from pathlib import Path

import pytest
import torch

from megatron_ext.model import build_model
from pretrain.hf import hf_logits
from pretrain.hf.export import check_exportable, check_exportable_to_any, export_checkpoint
from pretrain.hf.qwen3 import megatron_to_qwen
from pretrain.table import model_preset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))

S = 32
HYBRID = dict(window_size=5, window_attn_skip_freq=2)  # windows well inside the 32 tokens compared


def _spread_model(**options):
    torch.manual_seed(0)
    config = model_preset("tiny", vocab_size=200, **options)
    model = build_model(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():  # spread the weights so a wrong mapping shows
            p.copy_(1.0 + 0.15 * torch.randn_like(p) if "layernorm" in name else 0.15 * torch.randn_like(p))
    return model, config


def _assert_equal_logits(model, hf):
    tokens = torch.randint(0, 200, (2, S), generator=torch.Generator().manual_seed(5))
    positions = torch.arange(S, dtype=torch.float32)
    with torch.no_grad():
        expected = model(tokens, positions, None)[..., :200]
    torch.testing.assert_close(hf_logits(hf, tokens, positions), expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("options, architecture", [
    (dict(qk_layernorm=True), "Qwen3ForCausalLM"),
    (dict(qk_layernorm=True, **HYBRID), "Qwen3ForCausalLM"),
    (HYBRID, "Qwen2ForCausalLM"),
], ids=["qknorm", "qknorm_swa_hybrid", "swa_hybrid"])
def test_recipe_exports_compute_our_logits(megatron_world, options, architecture):
    model, config = _spread_model(**options)
    hf = megatron_to_qwen(model, config)
    assert type(hf).__name__ == architecture
    expected_types = ["sliding_attention" if local else "full_attention" for local in config.local_layers()]
    assert hf.config.layer_types == expected_types
    if config.window_size is not None:
        assert hf.config.sliding_window == config.window_size + 1  # HF counts the query's own key
    _assert_equal_logits(model, hf)


def test_a_window_off_by_one_would_show_in_the_logits(megatron_world):
    model, config = _spread_model(qk_layernorm=True, **HYBRID)
    hf = megatron_to_qwen(model, dataclasses.replace(config, window_size=config.window_size + 1))
    tokens = torch.randint(0, 200, (2, S), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ours = model(tokens, torch.arange(S, dtype=torch.float32), None)[..., :200]
    assert (hf_logits(hf, tokens) - ours).abs().max() > 1e-3


@pytest.mark.parametrize("options, message", [
    (dict(softmax_type="learnable"), r"attention sinks \(model.softmax_type=learnable\)"),
    (dict(softmax_type="off-by-one"), r"attention sinks \(model.softmax_type=off-by-one\)"),
    (dict(rotary_base_local=1e4, **HYBRID), r"a per-kind RoPE base \(model.rotary_base_local\)"),
    (dict(no_rope_freq=2, **HYBRID), r"NoPE layers \(model.no_rope_freq\)"),
    (dict(qk_layernorm=True, add_qkv_bias=True), r"model.add_qkv_bias"),
], ids=["learnable_sinks", "off_by_one", "local_base", "rnope_swa", "qknorm_biases"])
def test_what_no_architecture_expresses_is_refused_in_one_line(options, message):
    config = model_preset("tiny", **options)
    for check in (check_exportable_to_any, check_exportable):
        with pytest.raises(ValueError, match=message) as error:
            check(config)
        assert "\n" not in str(error.value)


def test_the_llama_export_refuses_qk_norm_and_windows_which_it_would_drop():
    for options in (dict(qk_layernorm=True), HYBRID):
        with pytest.raises(ValueError, match="writes them as Qwen3 / Qwen2"):
            check_exportable(model_preset("tiny", **options))


@pytest.mark.slow
def test_export_hf_writes_a_qwen3_directory_with_equal_logits(megatron_world, tmp_path):
    from transformers import AutoModelForCausalLM

    from hf_save_checkpoint import tiny_config, train_and_save
    from pretrain.trainer.inference_model import load_for_inference

    config = tiny_config(str(tmp_path / "run"), groups=2, untied=False)
    config = dataclasses.replace(config, model=dataclasses.replace(config.model, qk_layernorm=True, **HYBRID))
    checkpoint = train_and_save(config)
    out = export_checkpoint(checkpoint, tmp_path / "hf", no_tokenizer=True)
    assert json.loads((out / "config.json").read_text())["architectures"] == ["Qwen3ForCausalLM"]
    assert "A Qwen3 (`Qwen3ForCausalLM`)" in (out / "README.md").read_text()
    hf = AutoModelForCausalLM.from_pretrained(out).eval()
    model, _ = load_for_inference(checkpoint)
    tokens = torch.randint(0, 256, (1, S), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = model(tokens, torch.arange(S, dtype=torch.float32), None)[..., :config.model.vocab_size]
    torch.testing.assert_close(hf_logits(hf, tokens), expected.float(), atol=1e-4, rtol=0)
