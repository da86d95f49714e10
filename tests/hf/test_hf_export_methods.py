"""Exports of the 2025 position options: p-RoPE as transformers' "proportional" RoPE; the others refused."""

import pytest
import torch

from megatron_ext.model import build_model
from pretrain.hf import hf_logits
from pretrain.hf.export import check_exportable, megatron_to_llama
from pretrain.table import model_preset

S = 32


def test_prope_exports_to_llama_proportional_rope_with_equal_logits(megatron_world):
    torch.manual_seed(0)
    config = model_preset("tiny", vocab_size=200, rope_proportion=0.75)
    model = build_model(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():  # spread the weights so a wrong mapping shows
            p.copy_(1.0 + 0.15 * torch.randn_like(p) if "layernorm" in name else 0.15 * torch.randn_like(p))
    hf = megatron_to_llama(model, config)
    assert hf.config.rope_parameters["rope_type"] == "proportional"
    assert hf.config.rope_parameters["partial_rotary_factor"] == 0.75
    tokens = torch.randint(0, 200, (2, S), generator=torch.Generator().manual_seed(5))
    positions = torch.arange(S, dtype=torch.float32)
    with torch.no_grad():
        expected = model(tokens, positions, None)[..., :200]
    torch.testing.assert_close(hf_logits(hf, tokens, positions), expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("options,method", [(dict(no_rope_freq=2), "NoPE-interleaved"),
                                            (dict(ssmax_scale=0.3), "SSMax")])
def test_methods_that_llama_cannot_express_are_refused_in_one_line(options, method):
    with pytest.raises(ValueError, match=f"cannot export: {method}") as error:
        check_exportable(model_preset("tiny", **options))
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("temperature", [False, True], ids=["plain_nope", "with_temperature"])
def test_nope_interleaved_model_exports_to_llama4_text_with_equal_logits(megatron_world, temperature):
    from pretrain.hf.llama4 import megatron_to_llama4

    torch.manual_seed(1)
    config = model_preset("tiny", vocab_size=200, no_rope_freq=2, attn_temperature_tuning=temperature,
                          attn_temperature_beta=0.5, attn_temperature_floor=4)
    model = build_model(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.15 * torch.randn_like(p) if "layernorm" in name else 0.15 * torch.randn_like(p))
    hf = megatron_to_llama4(model, config)
    assert hf.config.no_rope_layers == [1, 0, 1, 0] and hf.config.attn_temperature_tuning is temperature
    tokens = torch.randint(0, 200, (2, S), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        expected = model(tokens, torch.arange(S, dtype=torch.float32), None)[..., :200]
        got = hf(tokens).logits
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)


def test_llama4_export_refuses_ssmax_in_one_line():
    from pretrain.hf.llama4 import llama4_config

    with pytest.raises(ValueError, match="cannot export: SSMax"):
        llama4_config(model_preset("tiny", no_rope_freq=2, ssmax_scale=0.3), 256)


@pytest.mark.parametrize("options", [dict(rope_proportion=0.75),
                                     dict(no_rope_freq=2, attn_temperature_tuning=True, attn_temperature_beta=0.5,
                                          attn_temperature_floor=4)], ids=["prope", "nope_interleave_temperature"])
def test_export_hf_of_a_trained_checkpoint_loads_with_auto_model_and_equal_logits(megatron_world, tmp_path, options):
    import dataclasses
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from hf_helpers import auto_model, megatron_logits, megatron_model, sample_tokens
    from hf_save_checkpoint import tiny_config, train_and_save

    from pretrain.hf.export import export_checkpoint

    config = tiny_config(str(tmp_path / "run"), groups=2, untied=False)
    config = dataclasses.replace(config, model=dataclasses.replace(config.model, **options))
    checkpoint = train_and_save(config)
    export_checkpoint(checkpoint, tmp_path / "hf", no_tokenizer=True)
    model, _ = megatron_model(checkpoint)
    tokens = sample_tokens(32)
    torch.testing.assert_close(hf_logits(auto_model(tmp_path / "hf"), tokens),
                               megatron_logits(model, tokens, torch.arange(32, dtype=torch.float32)),
                               atol=1e-4, rtol=0)
