"""The float-position RoPE hook: stock equivalence, fractional positions, per-sample and per-layer."""

import math

import pytest
import torch
import torch.nn.functional as F

from megatron_ext.model import build_model, transformer_config, layer_spec_function
from megatron_ext.sdpa_attention import with_core_attention
from pretrain.table import model_preset
from megatron_ext.positions import RopePositions, rope_inv_freq

B, S = 3, 32
CONFIG = model_preset("tiny")


@pytest.fixture(scope="module")
def model(megatron_world):
    torch.manual_seed(0)
    return build_model(model_preset("tiny")).eval()


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, 256, (B, S), generator=torch.Generator().manual_seed(3))


def reference_logits(state, config, tokens, positions, inv_freq=None, layer_positions=None,
                     attention_factor=1.0):
    """Plain-torch forward of the same architecture with RoPE at arbitrary float positions."""
    h, heads, groups, d = config.hidden_size, config.num_attention_heads, config.num_query_groups, config.kv_channels
    inv_freq = rope_inv_freq(d, config.rotary_base) if inv_freq is None else inv_freq
    eps = config.layernorm_epsilon

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    def rotate(x, pos):  # x [b, heads, s, d]; pos [s] or [b, s]
        angles = pos[..., None].float() * inv_freq  # [.., s, d/2]
        angles = torch.cat([angles, angles], -1)
        if angles.dim() == 3:
            angles = angles[:, None]
        x1, x2 = x[..., : d // 2], x[..., d // 2:]
        return (x * angles.cos() + torch.cat([-x2, x1], -1) * angles.sin()) * attention_factor

    x = F.embedding(tokens, state["embedding.word_embeddings.weight"])
    b, s = tokens.shape
    causal = torch.ones(s, s, dtype=torch.bool).tril()
    for layer in range(config.num_layers):
        p = f"decoder.layers.{layer}."
        pos = positions if layer_positions is None else layer_positions[layer]
        y = rms(x, state[p + "input_layernorm.weight"])
        qkv = (y @ state[p + "self_attention.linear_qkv.weight"].T).view(b, s, groups, heads // groups + 2, d)
        q = qkv[:, :, :, : heads // groups].reshape(b, s, heads, d).transpose(1, 2)
        k = qkv[:, :, :, -2].transpose(1, 2).repeat_interleave(heads // groups, 1)
        v = qkv[:, :, :, -1].transpose(1, 2).repeat_interleave(heads // groups, 1)
        q, k = rotate(q, pos), rotate(k, pos)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(d)
        attn = scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v
        x = x + attn.transpose(1, 2).reshape(b, s, heads * d) @ state[p + "self_attention.linear_proj.weight"].T
        y = rms(x, state[p + "pre_mlp_layernorm.weight"])
        gate, up = (y @ state[p + "mlp.linear_fc1.weight"].T).chunk(2, -1)
        x = x + (F.silu(gate) * up) @ state[p + "mlp.linear_fc2.weight"].T
    x = rms(x, state["decoder.final_layernorm.weight"])
    return x @ state["embedding.word_embeddings.weight"].T


def logits(model, tokens, positions):
    with torch.no_grad():
        return model(tokens, positions, None)


def test_arange_positions_reproduce_stock_megatron_bit_exactly(model, tokens):
    from megatron.core.models.gpt.gpt_model import GPTModel

    config = model_preset("tiny")
    # The same layer spec as ours (the core attention is not what this test is about).
    spec = with_core_attention(layer_spec_function(config)(normalization="RMSNorm"), config.core_attention)
    stock = GPTModel(config=transformer_config(config), transformer_layer_spec=spec,
                     vocab_size=config.padded_vocab_size(), max_sequence_length=S,
                     share_embeddings_and_output_weights=True, position_embedding_type="rope").eval()
    stock.load_state_dict(model.state_dict())
    arange = torch.arange(S)
    with torch.no_grad():
        expected = stock(tokens, arange[None].expand(B, S), None)
    assert torch.equal(logits(model, tokens, arange), expected)
    assert torch.equal(logits(model, tokens, arange.float()), expected)


def test_scaled_positions_equal_plain_torch_rope_reference(model, tokens):
    positions = 0.37 * torch.arange(S, dtype=torch.float32)
    expected = reference_logits(model.state_dict(), CONFIG, tokens, positions)
    torch.testing.assert_close(logits(model, tokens, positions)[..., :256], expected[..., :256],
                               atol=2e-5, rtol=1e-4)


def test_fractional_positions_change_the_output(model, tokens):
    arange = torch.arange(S, dtype=torch.float32)
    assert not torch.allclose(logits(model, tokens, arange), logits(model, tokens, 4.0 * arange))


def test_per_sample_positions_equal_running_each_sample_alone(model, tokens):
    g = torch.Generator().manual_seed(1)
    positions = torch.sort(torch.rand(B, S, generator=g) * 100, dim=-1).values
    batched = logits(model, tokens, positions)
    for i in range(B):
        alone = logits(model, tokens[i:i + 1], positions[i:i + 1])
        torch.testing.assert_close(batched[i:i + 1], alone, atol=1e-5, rtol=1e-5)


def test_per_layer_positions_equal_reference_with_a_different_scale_per_layer(model, tokens):
    arange = torch.arange(S, dtype=torch.float32)
    layer_positions = torch.stack([a * arange for a in (0.5, 1.0, 2.0, 8.0)])
    rope = RopePositions(positions=arange, layer_positions=layer_positions)
    expected = reference_logits(model.state_dict(), CONFIG, tokens, arange, layer_positions=layer_positions)
    torch.testing.assert_close(logits(model, tokens, rope)[..., :256], expected[..., :256], atol=2e-5, rtol=1e-4)


def test_replacement_inverse_frequencies_equal_reference_with_another_base(model, tokens):
    arange = torch.arange(S, dtype=torch.float32)
    inv_freq = rope_inv_freq(CONFIG.kv_channels, 80000.0)
    expected = reference_logits(model.state_dict(), CONFIG, tokens, arange, inv_freq=inv_freq)
    got = logits(model, tokens, RopePositions(positions=arange, inv_freq=inv_freq))
    torch.testing.assert_close(got[..., :256], expected[..., :256], atol=2e-5, rtol=1e-4)


def test_attention_factor_scales_cos_and_sin_like_yarn(model, tokens):
    arange = torch.arange(S, dtype=torch.float32)
    expected = reference_logits(model.state_dict(), CONFIG, tokens, arange, attention_factor=1.2)
    got = logits(model, tokens, RopePositions(positions=arange, attention_factor=1.2))
    torch.testing.assert_close(got[..., :256], expected[..., :256], atol=2e-5, rtol=1e-4)
    assert torch.equal(logits(model, tokens, arange), logits(model, tokens, arange))  # scale restored


def test_gradients_flow_with_float_positions(megatron_world, tokens):
    model = build_model(model_preset("tiny"))
    loss = model(tokens, 3.3 * torch.arange(S, dtype=torch.float32), None, labels=tokens).mean()
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
