"""QK-norm, sliding-window layers beside global ones (per-kind RoPE base, RoPE or NoPE per kind) and attention
sinks inside Megatron-Core, against the architecture written out."""

import math

import pytest
import torch
import torch.nn.functional as F

from megatron_ext.model import build_model
from megatron_ext.positions import nope_layers, rope_inv_freq
from pretrain.table import model_preset

B, S = 2, 24


def direct_logits(state, config, tokens, positions, inv_freq, windows, sinks=None, query_scale=None):
    """The architecture written out: per layer RoPE at `positions` with inv_freq[l] (None: NoPE), query i seeing
    keys i - windows[l] .. i (None: all before it), RMSNorm of each head's q and k before RoPE when the state has
    q_layernorm weights, sinks[l] [heads] (None: none) added to every softmax denominator as exp(s_h), and the query
    of token i on layer l times query_scale(l, i)."""
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
    index = torch.arange(s)
    for layer in range(config.num_layers):
        p = f"decoder.layers.{layer}."
        y = rms(x, state[p + "input_layernorm.weight"])
        qkv = (y @ state[p + "self_attention.linear_qkv.weight"].T).view(b, s, groups, heads // groups + 2, d)
        q = qkv[:, :, :, : heads // groups].reshape(b, s, heads, d).transpose(1, 2)
        k = qkv[:, :, :, -2].transpose(1, 2).repeat_interleave(heads // groups, 1)
        v = qkv[:, :, :, -1].transpose(1, 2).repeat_interleave(heads // groups, 1)
        if p + "self_attention.q_layernorm.weight" in state:
            q = rms(q, state[p + "self_attention.q_layernorm.weight"])
            k = rms(k, state[p + "self_attention.k_layernorm.weight"])
        if inv_freq[layer] is not None:
            q, k = rotate(q, inv_freq[layer]), rotate(k, inv_freq[layer])
        if query_scale is not None:
            q = q * query_scale(layer, index)[:, None]
        seen = index[None, :] <= index[:, None]
        if windows[layer] is not None:
            seen &= index[None, :] >= index[:, None] - windows[layer]
        scores = ((q @ k.transpose(-1, -2)) / math.sqrt(d)).masked_fill(~seen, float("-inf"))
        if sinks is None or sinks[layer] is None:
            probs = scores.softmax(-1)
        else:
            sink = sinks[layer].view(1, heads, 1, 1).expand(b, heads, s, 1)
            probs = torch.cat([scores, sink], -1).softmax(-1)[..., :-1]
        attn = probs @ v
        x = x + attn.transpose(1, 2).reshape(b, s, heads * d) @ state[p + "self_attention.linear_proj.weight"].T
        y = rms(x, state[p + "pre_mlp_layernorm.weight"])
        gate, up = (y @ state[p + "mlp.linear_fc1.weight"].T).chunk(2, -1)
        x = x + (F.silu(gate) * up) @ state[p + "mlp.linear_fc2.weight"].T
    x = rms(x, state["decoder.final_layernorm.weight"])
    return x @ state["embedding.word_embeddings.weight"].T


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, 256, (B, S), generator=torch.Generator().manual_seed(3))


def _logits(model, tokens, positions, mask=None):
    with torch.no_grad():
        return model(tokens, positions, mask)[..., :256]


def _build(**options):
    torch.manual_seed(0)
    config = model_preset("tiny", **options)
    model = build_model(config).eval()
    with torch.no_grad():  # norms and sinks away from their initial values, so a forward ignoring them differs
        for name, param in model.named_parameters():
            if "layernorm" in name or "softmax_offset" in name:
                param.copy_(torch.randn_like(param).abs() + 0.5 if "layernorm" in name else torch.randn_like(param))
    return model, config


def test_qk_layernorm_equals_a_direct_rmsnorm_of_each_heads_q_and_k_before_rope(megatron_world, tokens):
    model, config = _build(qk_layernorm=True)
    assert "decoder.layers.0.self_attention.q_layernorm.weight" in model.state_dict()
    freqs = rope_inv_freq(config.kv_channels, config.rotary_base)
    positions = 1.5 * torch.arange(S, dtype=torch.float32)
    expected = direct_logits(model.state_dict(), config, tokens, positions, [freqs] * 4, [None] * 4)
    torch.testing.assert_close(_logits(model, tokens, positions), expected, atol=1e-4, rtol=0)


def test_local_and_global_layers_equal_a_direct_forward_with_banded_masks_and_per_kind_bases(megatron_world, tokens):
    model, config = _build(window_size=5, window_attn_skip_freq=2, rotary_base=1e6, rotary_base_local=1e4)
    assert config.local_layers() == [True, False, True, False]
    local, global_ = rope_inv_freq(config.kv_channels, 1e4), rope_inv_freq(config.kv_channels, 1e6)
    positions = torch.arange(S, dtype=torch.float32)
    expected = direct_logits(model.state_dict(), config, tokens, positions, [local, global_] * 2, [5, None] * 2)
    torch.testing.assert_close(_logits(model, tokens, positions), expected, atol=1e-4, rtol=0)


def test_core_attentions_follow_megatrons_window_pattern(megatron_world):
    from megatron.core.transformer.utils import is_layer_window_attention

    model, config = _build(num_layers=6, window_size=3, window_attn_skip_freq=6)  # Gemma 3's 5:1
    cores = [layer.self_attention.core_attention for layer in model.decoder.layers]
    assert [core.window for core in cores] == [3, 3, 3, 3, 3, None]
    assert config.local_layers() == [is_layer_window_attention((3, 0), 6, n) for n in range(1, 7)]


def test_a_local_layer_ignores_keys_outside_its_window(megatron_world, tokens):
    model, _ = _build(num_layers=2, window_size=4)  # two local layers: token t reaches t + 8 at most
    positions = torch.arange(S, dtype=torch.float32)
    changed = tokens.clone()
    changed[:, 0] = (changed[:, 0] + 1) % 256
    before, after = _logits(model, tokens, positions), _logits(model, changed, positions)
    assert torch.equal(before[:, 9:], after[:, 9:])
    assert not torch.allclose(before[:, 1:9], after[:, 1:9])


def test_a_global_layer_sees_keys_the_local_ones_do_not(megatron_world, tokens):
    model, _ = _build(num_layers=2, window_size=4, window_attn_skip_freq=2)
    positions = torch.arange(S, dtype=torch.float32)
    changed = tokens.clone()
    changed[:, 0] = (changed[:, 0] + 1) % 256
    assert not torch.allclose(_logits(model, tokens, positions)[:, -1], _logits(model, changed, positions)[:, -1])


def test_the_window_composes_with_document_masking(megatron_world, tokens):
    from megatron_ext.positions.documents import Documents

    model, _ = _build(window_size=4, window_attn_skip_freq=2, rotary_base_local=500.0)
    documents = Documents(torch.tensor([[0] * 10 + [1] * (S - 10)] * B))
    positions = documents.offsets.float()
    packed = _logits(model, tokens, positions, documents.attention_mask())[:, 10:]
    alone = _logits(model, tokens[:, 10:], positions[:, 10:])
    torch.testing.assert_close(packed, alone, atol=1e-5, rtol=0)


def test_rnope_swa_global_layers_ignore_positions(megatron_world, tokens):
    model, config = _build(window_size=4, window_attn_skip_freq=2, no_rope_freq=2)
    assert [not n for n in nope_layers(4, 2)] == config.local_layers()  # RoPE exactly on the local layers
    freqs = rope_inv_freq(config.kv_channels, config.rotary_base)
    positions = 3.0 * torch.arange(S, dtype=torch.float32)
    expected = direct_logits(model.state_dict(), config, tokens, positions, [freqs, None] * 2, [4, None] * 2)
    torch.testing.assert_close(_logits(model, tokens, positions), expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("softmax_type", ["learnable", "off-by-one"])
def test_sinks_equal_a_direct_softmax_with_exp_s_in_the_denominator(megatron_world, tokens, softmax_type):
    model, config = _build(softmax_type=softmax_type, window_size=6, window_attn_skip_freq=2)
    state = model.state_dict()
    key = "decoder.layers.{}.self_attention.core_attention.softmax_offset"
    sinks = [state[key.format(l)] if softmax_type == "learnable" else torch.zeros(4) for l in range(4)]
    freqs = rope_inv_freq(config.kv_channels, config.rotary_base)
    positions = torch.arange(S, dtype=torch.float32)
    expected = direct_logits(state, config, tokens, positions, [freqs] * 4, [6, None] * 2, sinks)
    torch.testing.assert_close(_logits(model, tokens, positions), expected, atol=1e-4, rtol=0)


def test_a_query_that_sees_no_key_attends_to_the_sink_alone(megatron_world):
    model, _ = _build(softmax_type="learnable")
    core = model.decoder.layers[0].self_attention.core_attention
    q, k, v = torch.randn(6, 1, 4, 16), torch.randn(6, 1, 2, 16), torch.randn(6, 1, 2, 16)  # 2 query groups
    hidden = torch.ones(6, 6, dtype=torch.bool).triu(1)
    hidden[3] = True  # query 3's scores are all masked: only the sink is left in its softmax
    with torch.no_grad():
        context = core(q, k, v, hidden[None, None]).view(6, 4, 16)
    assert context[3].abs().max() < 1e-6
    assert context[2].abs().max() > 1e-2


def test_recipe_options_are_refused_in_one_line_each():
    cases = [(dict(window_size=0), "model.window_size must be >= 1"),
             (dict(window_attn_skip_freq=2), "set model.window_size"),
             (dict(rotary_base_local=1e4), "set model.window_size"),
             (dict(window_size=4, position_embedding_type="alibi"), "alibi is not supported"),
             (dict(window_size=4, core_attention="megatron"), "core_attention=sdpa"),
             (dict(window_size=4, rotary_base_local=1e4, rope_proportion=0.5), "rotary_base_local needs"),
             (dict(softmax_type="sink"), "model.softmax_type must be one of")]
    for options, message in cases:
        with pytest.raises(ValueError, match=message) as error:
            model_preset("tiny", **options)
        assert "\n" not in str(error.value)


def test_random_base_and_eval_rope_scaling_are_refused_with_a_local_base():
    config = model_preset("tiny", window_size=4, window_attn_skip_freq=2, rotary_base_local=1e4)
    for strategy, scaling in (("random_base", None), ("posaug", "yarn")):
        with pytest.raises(ValueError, match="rotary_base_local"):
            config.check_positions(strategy, scaling)


def _global_posaug_sampler(config, global_layers):
    from megatron_ext.positions import PositionConfig, build_sampler

    positions = PositionConfig(strategy="posaug", layer_mode="global", alpha_min=2.0, alpha_max=4.0)
    return build_sampler(positions, seed=0, train_seq_len=S, num_layers=config.num_layers,
                         rotary_dim=config.rotary_dim, rotary_base=config.rotary_base, total_steps=10,
                         global_layers=global_layers)


def test_posaug_on_global_layers_only_leaves_the_local_layers_angles_untouched(megatron_world):
    model, config = _build(window_size=4, window_attn_skip_freq=2, rotary_base_local=1e4, rotary_base=1e6)
    rope = _global_posaug_sampler(config, config.global_rope_layers()).training(
        3, S, first_sample=0, batch_size=B)
    plain = torch.arange(S, dtype=torch.float32)
    angles = model.rotary_angles_for(rope)  # [layers, s, 1, 1, d]
    expected = model.rotary_angles_for(type(rope)(plain))
    for layer, local in enumerate(config.local_layers()):
        assert torch.equal(angles[layer], expected[layer]) == local
    alpha = rope.layer_positions[1, 1].item()
    assert 2.0 <= alpha <= 4.0 and torch.equal(rope.layer_positions[1], alpha * plain)


def test_posaug_on_global_layers_is_refused_without_a_global_rope_layer():
    config = model_preset("tiny", window_size=4, window_attn_skip_freq=2, no_rope_freq=2)  # RNoPE-SWA
    with pytest.raises(ValueError, match="layer_mode=global scales the full-attention RoPE layers"):
        _global_posaug_sampler(config, config.global_rope_layers())
    sampler = _global_posaug_sampler(config, None)  # no window: refused at its first draw
    with pytest.raises(ValueError, match="set model.window_size"):
        sampler.training(0, S, first_sample=0, batch_size=B)


def test_context_parallelism_is_refused_for_windows_and_sinks():
    from megatron_ext.parallel import ParallelConfig

    for options in (dict(window_size=4), dict(softmax_type="learnable")):
        with pytest.raises(ValueError, match="set parallel.context_parallel_size=1"):
            ParallelConfig(context_parallel_size=2).check_context_parallel(model_preset("tiny", **options))


def test_ssmax_counts_only_the_keys_inside_a_local_layers_window(megatron_world, tokens):
    from megatron_ext.positions import ssmax_factor

    model, config = _build(window_size=5, window_attn_skip_freq=2, ssmax_scale=0.4)
    freqs = rope_inv_freq(config.kv_channels, config.rotary_base)
    positions = torch.arange(S, dtype=torch.float32)

    def scale(layer, index):  # n = keys seen: at most 6 on the local layers 1 and 3
        return ssmax_factor((index + 1).clamp(max=6) if layer % 2 == 0 else index + 1, 0.4)

    expected = direct_logits(model.state_dict(), config, tokens, positions, [freqs] * 4, [5, None] * 2,
                             query_scale=scale)
    torch.testing.assert_close(_logits(model, tokens, positions), expected, atol=1e-4, rtol=0)


def test_the_config_check_refuses_global_posaug_without_a_global_rope_layer():
    for options in ({}, dict(window_size=4), dict(window_size=4, window_attn_skip_freq=2, no_rope_freq=2)):
        with pytest.raises(ValueError, match="layer_mode=global scales the full-attention RoPE layers"):
            model_preset("tiny", **options).check_positions("posaug", None, "global")
    model_preset("tiny", window_size=4, window_attn_skip_freq=2).check_positions("posaug", None, "global")
