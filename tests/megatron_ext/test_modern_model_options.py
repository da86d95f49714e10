"""p-RoPE, NoPE-interleaved layers with Llama 4's temperature and SSMax inside Megatron-Core, against a plain forward."""

import math

import pytest
import torch
import torch.nn.functional as F

from megatron_ext.model import build_model
from megatron_ext.positions import attention_temperature, nope_layers, prope_inv_freq, rope_inv_freq, ssmax_factor
from pretrain.table import model_preset

B, S = 2, 24


def direct_logits(state, config, tokens, positions, inv_freq, query_scale):
    """The architecture written out: RoPE at `positions` with `inv_freq` (None: no RoPE) per layer, and the query
    of token i on layer l multiplied by query_scale(l, i)."""
    h, heads, groups, d = config.hidden_size, config.num_attention_heads, config.num_query_groups, config.kv_channels
    eps = config.layernorm_epsilon

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    def rotate(x, freqs):
        angles = positions[:, None].float() * freqs
        angles = torch.cat([angles, angles], -1)
        x1, x2 = x[..., : d // 2], x[..., d // 2:]
        return x * angles.cos() + torch.cat([-x2, x1], -1) * angles.sin()

    x = F.embedding(tokens, state["embedding.word_embeddings.weight"])
    b, s = tokens.shape
    causal = torch.ones(s, s, dtype=torch.bool).tril()
    for layer in range(config.num_layers):
        p = f"decoder.layers.{layer}."
        y = rms(x, state[p + "input_layernorm.weight"])
        qkv = (y @ state[p + "self_attention.linear_qkv.weight"].T).view(b, s, groups, heads // groups + 2, d)
        q = qkv[:, :, :, : heads // groups].reshape(b, s, heads, d).transpose(1, 2)
        k = qkv[:, :, :, -2].transpose(1, 2).repeat_interleave(heads // groups, 1)
        v = qkv[:, :, :, -1].transpose(1, 2).repeat_interleave(heads // groups, 1)
        if inv_freq[layer] is not None:
            q, k = rotate(q, inv_freq[layer]), rotate(k, inv_freq[layer])
        q = q * query_scale(layer, torch.arange(s))[:, None]
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(d)
        attn = scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v
        x = x + attn.transpose(1, 2).reshape(b, s, heads * d) @ state[p + "self_attention.linear_proj.weight"].T
        y = rms(x, state[p + "pre_mlp_layernorm.weight"])
        gate, up = (y @ state[p + "mlp.linear_fc1.weight"].T).chunk(2, -1)
        x = x + (F.silu(gate) * up) @ state[p + "mlp.linear_fc2.weight"].T
    x = rms(x, state["decoder.final_layernorm.weight"])
    return x @ state["embedding.word_embeddings.weight"].T


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, 256, (B, S), generator=torch.Generator().manual_seed(3))


def _logits(model, tokens, positions):
    with torch.no_grad():
        return model(tokens, positions, None)[..., :256]


def _build(**options):
    torch.manual_seed(0)
    config = model_preset("tiny", **options)
    return build_model(config).eval(), config


def test_prope_model_equals_a_direct_forward_with_dropped_frequencies(megatron_world, tokens):
    model, config = _build(rope_proportion=0.5)
    inv_freq = prope_inv_freq(config.kv_channels, config.rotary_base, 0.5)
    assert torch.equal(model.rotary_pos_emb.inv_freq, inv_freq)
    positions = 0.37 * torch.arange(S, dtype=torch.float32)
    expected = direct_logits(model.state_dict(), config, tokens, positions, [inv_freq] * config.num_layers,
                             lambda layer, i: torch.ones(len(i)))
    torch.testing.assert_close(_logits(model, tokens, positions), expected, atol=1e-4, rtol=0)


def test_prope_with_proportion_zero_ignores_positions(megatron_world, tokens):
    model, _ = _build(rope_proportion=0.0)
    plain = _logits(model, tokens, torch.arange(S, dtype=torch.float32))
    assert torch.equal(plain, _logits(model, tokens, 5.5 * torch.arange(S, dtype=torch.float32) + 100))


def test_nope_layers_ignore_positions(megatron_world, tokens):
    model, _ = _build(no_rope_freq=1)  # every layer NoPE: the whole model must not see positions
    plain = _logits(model, tokens, torch.arange(S, dtype=torch.float32))
    assert torch.equal(plain, _logits(model, tokens, 3.0 * torch.arange(S, dtype=torch.float32) + 7))
    rope_model, _ = _build(no_rope_freq=2)  # layer 1 keeps RoPE: positions matter again
    assert not torch.allclose(_logits(rope_model, tokens, torch.arange(S, dtype=torch.float32)),
                              _logits(rope_model, tokens, 3.0 * torch.arange(S, dtype=torch.float32) + 7))


def test_nope_interleave_with_temperature_equals_a_direct_forward(megatron_world, tokens):
    model, config = _build(no_rope_freq=2, attn_temperature_tuning=True, attn_temperature_beta=0.3,
                           attn_temperature_floor=4)
    nope = nope_layers(config.num_layers, 2)
    freqs = rope_inv_freq(config.kv_channels, config.rotary_base)
    positions = 1.7 * torch.arange(S, dtype=torch.float32)

    def scale(layer, index):
        return attention_temperature(index, 0.3, 4.0) if nope[layer] else torch.ones(len(index))

    expected = direct_logits(model.state_dict(), config, tokens, positions,
                             [None if n else freqs for n in nope], scale)
    torch.testing.assert_close(_logits(model, tokens, positions), expected, atol=1e-4, rtol=0)


def test_ssmax_equals_a_direct_forward_with_logits_times_s_log_n(megatron_world, tokens):
    model, config = _build(ssmax_scale=0.4)
    freqs = rope_inv_freq(config.kv_channels, config.rotary_base)
    positions = torch.arange(S, dtype=torch.float32)
    expected = direct_logits(model.state_dict(), config, tokens, positions, [freqs] * config.num_layers,
                             lambda layer, i: ssmax_factor(i + 1, 0.4))
    torch.testing.assert_close(_logits(model, tokens, positions), expected, atol=1e-4, rtol=0)


def test_posaug_positions_reach_only_the_rope_layers_of_a_nope_interleaved_model(megatron_world, tokens):
    model, config = _build(no_rope_freq=2)
    nope = nope_layers(config.num_layers, 2)
    freqs = rope_inv_freq(config.kv_channels, config.rotary_base)
    positions = 2.5 * torch.arange(S, dtype=torch.float32)  # a PosAug draw α = 2.5
    expected = direct_logits(model.state_dict(), config, tokens, positions, [None if n else freqs for n in nope],
                             lambda layer, i: torch.ones(len(i)))
    torch.testing.assert_close(_logits(model, tokens, positions), expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("options", [dict(ssmax_scale=0.4),
                                     dict(no_rope_freq=2, attn_temperature_tuning=True, attn_temperature_floor=4)],
                         ids=["ssmax", "nope_temperature"])
def test_query_scaling_restarts_at_every_document_of_a_packed_window(megatron_world, tokens, options):
    from megatron_ext.positions.documents import Documents

    model, _ = _build(**options)
    documents = Documents(torch.tensor([[0] * 10 + [1] * (S - 10)] * B))
    positions = documents.offsets.float()
    packed = model(tokens, positions, documents.attention_mask())[:, 10:, :256]
    alone = _logits(model, tokens[:, 10:], positions[:, 10:])
    torch.testing.assert_close(packed.detach(), alone, atol=1e-5, rtol=0)


def test_context_parallelism_is_refused_for_models_that_scale_queries_by_index():
    from megatron_ext.parallel import ParallelConfig

    for options in (dict(ssmax_scale=0.4), dict(no_rope_freq=2, attn_temperature_tuning=True),
                    dict(position_embedding_type="alibi")):
        with pytest.raises(ValueError, match="set parallel.context_parallel_size=1"):
            ParallelConfig(context_parallel_size=2).check_context_parallel(model_preset("tiny", **options))


@pytest.mark.parametrize("options,match", [
    (dict(ssmax_scale=0.4, position_embedding_type="alibi"), "ssmax_scale.*alibi"),
    (dict(rope_proportion=0.5, position_embedding_type="none"), "rope_proportion"),
    (dict(no_rope_freq=0), "no_rope_freq"),
    (dict(attn_temperature_tuning=True), "no_rope_freq"),
    (dict(ssmax_scale=0.0), "ssmax_scale"),
])
def test_inconsistent_options_are_refused_naming_the_field(options, match):
    with pytest.raises(ValueError, match=match):
        model_preset("tiny", **options)


def test_prope_refuses_inference_time_scaling_that_would_drop_its_frequencies():
    with pytest.raises(ValueError, match="p-RoPE"):
        model_preset("tiny", rope_proportion=0.5).check_positions("none", "yarn")
