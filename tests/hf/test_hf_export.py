"""In-memory Megatron -> HF Llama conversion: logits match at integer and fractional positions."""

import pytest
import torch

from megatron_ext.model import build_model
from pretrain.table import model_preset
from pretrain.hf import hf_logits
from pretrain.hf.export import llama_config, megatron_to_llama
from pretrain.hf.weight_map import merge_qkv, split_qkv

B, S = 2, 32


def spread_weights(model, seed):
    """Re-draw every weight with a larger spread so a wrong mapping shows in the logits."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g) * 0.15
            p.copy_(1.0 + noise if "layernorm" in name or "layer_norm" in name else noise)
    return model.eval()


def megatron_logits(model, tokens, positions):
    with torch.no_grad():
        return model(tokens, positions, None)


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, 200, (B, S), generator=torch.Generator().manual_seed(5))


@pytest.mark.parametrize("groups,untied", [(2, False), (4, True)], ids=["gqa_tied", "mha_untied"])
def test_llama_logits_equal_megatron_logits_at_fractional_positions(megatron_world, tokens, groups, untied):
    config = model_preset("tiny", num_query_groups=groups, vocab_size=200,
                    untie_embeddings_and_output_weights=untied)
    model = spread_weights(build_model(config), seed=groups)
    hf = megatron_to_llama(model, config)
    assert hf.config.vocab_size == 200 and hf.config.num_key_value_heads == groups
    for positions in (torch.arange(S, dtype=torch.float32), 0.37 * torch.arange(S, dtype=torch.float32)):
        expected = megatron_logits(model, tokens, positions)[..., :200]
        torch.testing.assert_close(hf_logits(hf, tokens, positions), expected, atol=1e-4, rtol=0)


def test_llama_from_state_dict_equals_llama_from_module(megatron_world, tokens):
    config = model_preset("tiny", vocab_size=200)
    model = spread_weights(build_model(config), seed=7)
    from_module = hf_logits(megatron_to_llama(model, config), tokens)
    from_state = hf_logits(megatron_to_llama(model.state_dict(), config), tokens)
    assert torch.equal(from_module, from_state)


def test_split_then_merge_qkv_restores_megatron_rows():
    config = model_preset("tiny")  # 4 heads in 2 groups
    qkv = torch.randn((4 + 2 * 2) * 16, 64)
    assert torch.equal(merge_qkv(*split_qkv(qkv, config), config), qkv)


def test_interleaved_rope_is_refused():
    with pytest.raises(ValueError, match="interleaved RoPE"):
        llama_config(model_preset("tiny", rotary_interleaved=True), 256)
