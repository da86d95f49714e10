"""ALiBi and NoPE: slopes, hand-computed bias matrices, Megatron models against a plain-torch reference.

Runtime: ~10 s on 2 cores (three tiny models, forward only but one backward).
"""

import math

import pytest
import torch
import torch.nn.functional as F

from megatron_ext.alibi import alibi_bias, alibi_slopes
from megatron_ext.model import ModelConfig, build_model
from pretrain.table import model_preset as preset
from megatron_ext.positions import RopePositions

B, S = 2, 12
CONFIG = preset("tiny")


def test_slopes_for_a_power_of_two_are_two_to_the_minus_eight_h_over_n():
    assert alibi_slopes(8).tolist() == [2.0 ** -h for h in range(1, 9)]
    assert alibi_slopes(4).tolist() == [2.0 ** -(2 * h) for h in range(1, 5)]


def test_slopes_for_six_heads_interleave_the_eight_head_slopes_like_press_et_al():
    # Four-head slopes, then every other slope of eight heads: 2^-1, 2^-3.
    assert alibi_slopes(6).tolist() == [2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3]


def test_bias_at_integer_positions_equals_the_hand_computed_matrix():
    bias = alibi_bias(torch.tensor([0, 1, 2]), torch.tensor([0.5, 0.25]))
    distance = torch.tensor([[0.0, 1, 2], [1, 0, 1], [2, 1, 0]])
    assert bias.shape == (1, 2, 3, 3)
    assert torch.equal(bias[0, 0], -0.5 * distance)
    assert torch.equal(bias[0, 1], -0.25 * distance)


def test_bias_at_float_positions_uses_the_float_distances():
    bias = alibi_bias(torch.tensor([0.0, 0.5, 2.0]), torch.tensor([0.5]))
    expected = -0.5 * torch.tensor([[0.0, 0.5, 2.0], [0.5, 0.0, 1.5], [2.0, 1.5, 0.0]])
    assert torch.equal(bias[0, 0], expected)


def test_per_sample_positions_give_one_bias_per_sample():
    positions = torch.tensor([[0.0, 1.0], [0.0, 3.0]])
    bias = alibi_bias(positions, torch.tensor([1.0]))
    assert bias.shape == (2, 1, 2, 2)
    assert bias[1, 0, 1, 0] == -3.0 and bias[0, 0, 1, 0] == -1.0


def reference_logits(state, config: ModelConfig, tokens, positions=None, slopes=None):
    """Plain-torch forward of the tiny architecture without RoPE; ALiBi bias when slopes are given."""
    h, heads, groups, d = config.hidden_size, config.num_attention_heads, config.num_query_groups, config.kv_channels
    eps = config.layernorm_epsilon

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    x = F.embedding(tokens, state["embedding.word_embeddings.weight"])
    b, s = tokens.shape
    causal = torch.ones(s, s, dtype=torch.bool).tril()
    bias = 0.0
    if slopes is not None:
        p = positions.float() if positions.dim() == 2 else positions.float()[None]
        bias = -slopes[None, :, None, None] * (p[:, None, :, None] - p[:, None, None, :]).abs()
    for layer in range(config.num_layers):
        pre = f"decoder.layers.{layer}."
        y = rms(x, state[pre + "input_layernorm.weight"])
        qkv = (y @ state[pre + "self_attention.linear_qkv.weight"].T).view(b, s, groups, heads // groups + 2, d)
        q = qkv[:, :, :, : heads // groups].reshape(b, s, heads, d).transpose(1, 2)
        k = qkv[:, :, :, -2].transpose(1, 2).repeat_interleave(heads // groups, 1)
        v = qkv[:, :, :, -1].transpose(1, 2).repeat_interleave(heads // groups, 1)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(d) + bias
        attn = scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v
        x = x + attn.transpose(1, 2).reshape(b, s, heads * d) @ state[pre + "self_attention.linear_proj.weight"].T
        y = rms(x, state[pre + "pre_mlp_layernorm.weight"])
        gate, up = (y @ state[pre + "mlp.linear_fc1.weight"].T).chunk(2, -1)
        x = x + (F.silu(gate) * up) @ state[pre + "mlp.linear_fc2.weight"].T
    x = rms(x, state["decoder.final_layernorm.weight"])
    return x @ state["embedding.word_embeddings.weight"].T


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, 256, (B, S), generator=torch.Generator().manual_seed(5))


@pytest.fixture(scope="module")
def alibi_model(megatron_world):
    torch.manual_seed(0)
    return build_model(preset("tiny", position_embedding_type="alibi")).eval()


@pytest.fixture(scope="module")
def nope_model(megatron_world):
    torch.manual_seed(0)
    return build_model(preset("tiny", position_embedding_type="none")).eval()


def run(model, tokens, positions):
    with torch.no_grad():
        return model(tokens, positions, None)[..., :256]


def test_alibi_model_at_integer_positions_equals_the_reference(alibi_model, tokens):
    positions = torch.arange(S)
    expected = reference_logits(alibi_model.state_dict(), CONFIG, tokens, positions, alibi_slopes(4))
    torch.testing.assert_close(run(alibi_model, tokens, positions), expected, atol=2e-5, rtol=1e-4)


def test_alibi_model_at_per_sample_float_positions_equals_the_reference(alibi_model, tokens):
    g = torch.Generator().manual_seed(2)
    positions = torch.sort(torch.rand(B, S, generator=g) * 40, dim=-1).values  # RFS-like
    expected = reference_logits(alibi_model.state_dict(), CONFIG, tokens, positions, alibi_slopes(4))
    torch.testing.assert_close(run(alibi_model, tokens, positions), expected, atol=2e-5, rtol=1e-4)


def test_alibi_model_output_depends_on_the_positions(alibi_model, tokens):
    arange = torch.arange(S, dtype=torch.float32)
    assert not torch.allclose(run(alibi_model, tokens, arange), run(alibi_model, tokens, 3.0 * arange))


def test_nope_model_ignores_positions_and_equals_attention_without_positions(nope_model, tokens):
    arange = torch.arange(S, dtype=torch.float32)
    expected = reference_logits(nope_model.state_dict(), CONFIG, tokens)
    torch.testing.assert_close(run(nope_model, tokens, arange), expected, atol=2e-5, rtol=1e-4)
    assert torch.equal(run(nope_model, tokens, arange), run(nope_model, tokens, 7.5 * arange))


def test_alibi_and_nope_checkpoints_have_the_rope_models_parameter_names(alibi_model, nope_model, megatron_world):
    rope_keys = set(build_model(preset("tiny")).state_dict())
    assert set(alibi_model.state_dict()) == rope_keys == set(nope_model.state_dict())


def test_alibi_gradients_flow_through_the_biased_attention(megatron_world, tokens):
    model = build_model(preset("tiny", position_embedding_type="alibi"))
    loss = model(tokens, torch.arange(S, dtype=torch.float32), None, labels=tokens).mean()
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_alibi_refuses_a_megatron_inference_context_naming_greedy_generate(alibi_model, tokens):
    from megatron.core.inference.contexts import StaticInferenceContext

    context = StaticInferenceContext(max_batch_size=B, max_sequence_length=64)
    with pytest.raises(ValueError, match="greedy_generate"):
        alibi_model(tokens, torch.arange(S, dtype=torch.float32), None, inference_context=context)


def test_alibi_refuses_per_layer_positions_naming_rope(alibi_model, tokens):
    arange = torch.arange(S, dtype=torch.float32)
    rope = RopePositions(positions=arange, layer_positions=torch.stack([arange] * CONFIG.num_layers))
    with pytest.raises(ValueError, match="position_embedding_type=rope"):
        run(alibi_model, tokens, rope)


def test_unknown_position_embedding_type_is_rejected_naming_the_choices():
    with pytest.raises(ValueError, match="rope.*none.*alibi"):
        preset("tiny", position_embedding_type="learned_absolute")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal")
def test_transformer_engine_alibi_on_cpu_fails_before_importing_transformer_engine():
    import sys

    from megatron_ext.alibi_attention import alibi_layer_spec

    with pytest.raises(RuntimeError, match="transformer_impl=local"):
        alibi_layer_spec("transformer_engine")
    assert "transformer_engine" not in sys.modules
