"""Export of NoPE-interleaved models (model.no_rope_freq, Llama 4's attention temperature) to transformers' Llama 4
text architecture (`Llama4ForCausalLM`), which has per-layer RoPE switches (`no_rope_layers`) and the same
temperature 1 + attn_scale·log1p(⌊(i + 1) / floor_scale⌋) on its NoPE layers.

Mapping: dense SwiGLU in every layer (moe_layers = []), no q/k L2 norm (use_qk_norm = false), no chunked attention
(layer_types all "full_attention"; see FULL_ATTENTION_CHUNK). RoPE θ goes in both transformers layouts (rope_theta and
rope_parameters, pretrain.hf.rope): 4.57 reads only the first (its default is 500000). Works, to equal logits with and
without the cache, under transformers 4.57.1, 5.0.0, 5.4.0, 5.5.0 and 5.24.0 (docs/hf.md).

Llama 4 rotates adjacent channel pairs (2k, 2k+1) by frequency k; Megatron's
non-interleaved RoPE rotates (k, k + d/2). Permuting the rows of q and k within each head to (0, d/2, 1, d/2 + 1, …)
turns one into the other and leaves every q·k (so the NoPE layers too) unchanged; v and o are not touched.
"""

from __future__ import annotations

import torch

from megatron_ext.model import ModelConfig
from pretrain.hf.weight_map import megatron_to_hf_names

# Our HF Llama names → Llama 4 text names (the rest are equal).
_RENAMES = (("mlp.gate_proj", "feed_forward.gate_proj"), ("mlp.up_proj", "feed_forward.up_proj"),
            ("mlp.down_proj", "feed_forward.down_proj"))

# attention_chunk_size written with every layer_types entry "full_attention", so no layer is chunked. transformers
# 4.57 builds the chunked mask on every forward even when no layer uses it and raises on a null size ("Could not find
# an `attention_chunk_size`"), and its cache sizes chunked layers by it (TypeError on null), so null fails there. A
# size above any sequence length makes even a reader that chunks by the size alone compute full causal attention.
FULL_ATTENTION_CHUNK = 2**31 - 1


def check_llama4_exportable(model_config: ModelConfig) -> None:
    """Refuse what Llama 4 text cannot express for a NoPE-interleaved model (ValueError naming the field)."""
    for field, why in (("ssmax_scale", "SSMax"), ("add_qkv_bias", "q/k/v biases"),
                       ("use_rope_scaling", "Llama 3 RoPE scaling"), ("rotary_interleaved", "interleaved RoPE")):
        if getattr(model_config, field):
            raise ValueError(f"cannot export: {why} (model.{field}) has no Llama 4 text equivalent")
    if model_config.rope_proportion < 1.0:
        raise ValueError("cannot export: p-RoPE together with NoPE-interleaved layers (Llama 4 text has no "
                         "proportional RoPE); drop model.rope_proportion or model.no_rope_freq")


def llama4_config(model_config: ModelConfig, vocab_size: int, **extra):
    """`Llama4TextConfig` of a NoPE-interleaved model (dense, no qk-norm, no chunking)."""
    from transformers import Llama4TextConfig

    from megatron_ext.positions import nope_layers
    from pretrain.hf.rope import hf_rope_fields

    check_llama4_exportable(model_config)
    rope = hf_rope_fields(model_config, None)  # plain RoPE (p-RoPE and Llama 3 scaling are refused above)
    n_layers = model_config.num_layers
    return Llama4TextConfig(
        vocab_size=int(vocab_size), hidden_size=model_config.hidden_size,
        intermediate_size=model_config.ffn_hidden_size, intermediate_size_mlp=model_config.ffn_hidden_size,
        num_hidden_layers=model_config.num_layers, num_attention_heads=model_config.num_attention_heads,
        num_key_value_heads=model_config.num_query_groups, head_dim=model_config.kv_channels, hidden_act="silu",
        rms_norm_eps=model_config.layernorm_epsilon,
        tie_word_embeddings=not model_config.untie_embeddings_and_output_weights, moe_layers=[], num_local_experts=1,
        use_qk_norm=False, attention_chunk_size=FULL_ATTENTION_CHUNK, layer_types=["full_attention"] * n_layers,
        attention_bias=False,
        no_rope_layers=[int(not nope) for nope in nope_layers(model_config.num_layers, model_config.no_rope_freq)],
        attn_temperature_tuning=bool(model_config.attn_temperature_tuning),
        floor_scale=int(model_config.attn_temperature_floor), attn_scale=float(model_config.attn_temperature_beta),
        **rope, **{"bos_token_id": None, "eos_token_id": None, "pad_token_id": None, **extra})


def _interleave_rows(weight: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Rows of each head reordered (0, d/2, 1, d/2 + 1, …): half-split RoPE channels → adjacent pairs."""
    order = torch.arange(head_dim).view(2, head_dim // 2).t().reshape(-1)
    return weight.view(-1, head_dim, weight.shape[-1])[:, order].reshape(weight.shape)


def megatron_to_llama4(model_or_state, model_config: ModelConfig, *, vocab_size: int | None = None, **extra):
    """In-memory float32 `Llama4ForCausalLM` (sdpa) with a TP=1/PP=1 NoPE-interleaved model's weights."""
    from transformers import Llama4ForCausalLM

    raw = model_or_state.state_dict() if isinstance(model_or_state, torch.nn.Module) else dict(model_or_state)
    plain = {k: v for k, v in raw.items() if torch.is_tensor(v) and "_extra_state" not in k}
    vocab = model_config.vocab_size if vocab_size is None else int(vocab_size)
    config = llama4_config(model_config, vocab, **extra)
    state = {}
    for name, tensor in megatron_to_hf_names(plain, model_config, vocab).items():
        for old, new in _RENAMES:
            name = name.replace(old, new)
        if name.endswith(("self_attn.q_proj.weight", "self_attn.k_proj.weight")):
            tensor = _interleave_rows(tensor, model_config.kv_channels)
        state[name] = tensor.detach().to(torch.float32).contiguous()
    with torch.device("cpu"):
        hf = Llama4ForCausalLM._from_config(config, attn_implementation="sdpa").to(torch.float32)
    missing, unexpected = hf.load_state_dict(state, strict=False)
    missing = [m for m in missing if not (m == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise RuntimeError(f"weight mapping mismatch: missing {missing}, unexpected {unexpected}")
    if config.tie_word_embeddings:
        hf.tie_weights()
    return hf.eval()
