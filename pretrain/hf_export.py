"""Hugging Face export (Megatron GPT -> `LlamaForCausalLM`) and import (Llama -> our checkpoint).

Weight layout (TP=1/PP=1 state dict of `FloatPositionGPTModel`, local or TE spec):

- `self_attention.linear_qkv.weight` is grouped per query group: rows
  `[q_0 .. q_{h/g-1}, k, v]` for group 0, then group 1, ...; split into q/k/v_proj.
- `mlp.linear_fc1.weight` is `[gate; up]` (SwiGLU); split into gate_proj / up_proj.
- Megatron's default (non-interleaved) RoPE rotates halves exactly like HF's
  `rotate_half`, so q/k rows need no permutation; interleaved RoPE is refused.
- The embedding (and untied output layer) carry vocabulary padding; it is trimmed.

HF Llama computes `inv_freq @ position_ids.float()`, so fractional positions can be
passed as `position_ids`; pass an all-ones `attention_mask` too (`hf_logits` does), or
transformers reads non-unit position gaps as packed sequences and masks across them.
"""

from __future__ import annotations

from typing import Any

import torch

from megatron_ext.model import ModelConfig

# Extra config.json field recording how the model was trained (strategy, window, ...).
TRAINING_METADATA_KEY = "posaug_training"


def _check_exportable(model_config: ModelConfig) -> None:
    """Refuse architectures that HF Llama cannot express exactly."""
    if model_config.rotary_interleaved:
        raise ValueError("cannot export: the checkpoint was trained with interleaved RoPE "
                         "(model.rotary_interleaved=true); HF Llama's rotate_half matches only "
                         "Megatron's default non-interleaved RoPE")


def llama_config(model_config: ModelConfig, vocab_size: int, rope_scaling: dict | None = None,
                 **extra: Any):
    """`LlamaConfig` with our architecture; rope_scaling is an HF rope dict ({'rope_type': ...})."""
    from transformers import LlamaConfig

    _check_exportable(model_config)
    rope = {"rope_type": "default", "rope_theta": float(model_config.rotary_base)}
    max_positions = model_config.seq_length
    if rope_scaling:
        rope = {**rope, **{k: v for k, v in rope_scaling.items() if k != "type"}}
        rope["rope_type"] = rope_scaling.get("rope_type", rope_scaling.get("type"))
        if rope["rope_type"] == "yarn":
            rope.setdefault("original_max_position_embeddings", model_config.seq_length)
            # HF checks factor == max_position_embeddings / original window.
            max_positions = int(round(rope["original_max_position_embeddings"] * float(rope["factor"])))
    defaults = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None,
                    max_position_embeddings=max_positions)
    return LlamaConfig(
        vocab_size=int(vocab_size),
        hidden_size=model_config.hidden_size,
        intermediate_size=model_config.ffn_hidden_size,
        num_hidden_layers=model_config.num_layers,
        num_attention_heads=model_config.num_attention_heads,
        num_key_value_heads=model_config.num_query_groups,
        head_dim=model_config.kv_channels,
        hidden_act="silu",
        rms_norm_eps=model_config.layernorm_epsilon,
        rope_parameters=rope,
        tie_word_embeddings=not model_config.untie_embeddings_and_output_weights,
        attention_bias=False,
        mlp_bias=False,
        attention_dropout=0.0,
        initializer_range=model_config.init_method_std,
        **{**defaults, **extra},
    )


def _plain_state(model_or_state) -> dict[str, torch.Tensor]:
    """Tensor entries of a model's (or DDP wrapper's) state dict, without `_extra_state`."""
    if isinstance(model_or_state, torch.nn.Module):
        module = getattr(model_or_state, "module", model_or_state)
        state = module.state_dict()
    else:
        state = dict(model_or_state)
    out = {}
    for name, value in state.items():
        if name.startswith("module."):
            name = name[len("module."):]
        if "_extra_state" in name or not torch.is_tensor(value):
            continue
        out[name] = value
    return out


def _first(state: dict, *names: str) -> torch.Tensor:
    for name in names:
        if name in state:
            return state[name]
    raise KeyError(f"none of {names} in the Megatron state dict")


def split_qkv(qkv: torch.Tensor, model_config: ModelConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Megatron grouped QKV rows [g × (q..., k, v)] -> (q_proj, k_proj, v_proj) weights."""
    heads, groups, d = model_config.num_attention_heads, model_config.num_query_groups, model_config.kv_channels
    per_group = heads // groups
    grouped = qkv.reshape(groups, per_group + 2, d, qkv.shape[-1])
    q = grouped[:, :per_group].reshape(heads * d, -1)
    k = grouped[:, per_group].reshape(groups * d, -1)
    v = grouped[:, per_group + 1].reshape(groups * d, -1)
    return q, k, v


def merge_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, model_config: ModelConfig) -> torch.Tensor:
    """Inverse of `split_qkv`."""
    heads, groups, d = model_config.num_attention_heads, model_config.num_query_groups, model_config.kv_channels
    per_group = heads // groups
    h = q.shape[-1]
    grouped = torch.cat([q.reshape(groups, per_group, d, h), k.reshape(groups, 1, d, h),
                         v.reshape(groups, 1, d, h)], dim=1)
    return grouped.reshape(-1, h)


def megatron_state_to_llama(state: dict[str, torch.Tensor], model_config: ModelConfig,
                            vocab_size: int | None = None) -> dict[str, torch.Tensor]:
    """HF Llama state dict from a TP=1/PP=1 Megatron state dict (vocabulary padding trimmed)."""
    _check_exportable(model_config)
    state = _plain_state(state)
    vocab = model_config.vocab_size if vocab_size is None else int(vocab_size)
    embedding = state["embedding.word_embeddings.weight"]
    if vocab > embedding.shape[0]:
        raise ValueError(f"vocab_size {vocab} exceeds the checkpoint's embedding rows {embedding.shape[0]}")
    out = {"model.embed_tokens.weight": embedding[:vocab]}
    f = model_config.ffn_hidden_size
    for i in range(model_config.num_layers):
        p, o = f"decoder.layers.{i}.", f"model.layers.{i}."
        # Local spec keeps separate norms; the TE spec fuses them into the following linear.
        out[o + "input_layernorm.weight"] = _first(
            state, p + "input_layernorm.weight", p + "self_attention.linear_qkv.layer_norm_weight")
        out[o + "post_attention_layernorm.weight"] = _first(
            state, p + "pre_mlp_layernorm.weight", p + "mlp.linear_fc1.layer_norm_weight")
        q, k, v = split_qkv(state[p + "self_attention.linear_qkv.weight"], model_config)
        out[o + "self_attn.q_proj.weight"] = q
        out[o + "self_attn.k_proj.weight"] = k
        out[o + "self_attn.v_proj.weight"] = v
        out[o + "self_attn.o_proj.weight"] = state[p + "self_attention.linear_proj.weight"]
        fc1 = state[p + "mlp.linear_fc1.weight"]
        if fc1.shape[0] != 2 * f:
            raise ValueError(f"cannot export: layer {i} mlp.linear_fc1 has {fc1.shape[0]} rows, expected "
                             f"2 × ffn_hidden_size = {2 * f} (the model must be SwiGLU)")
        out[o + "mlp.gate_proj.weight"] = fc1[:f]
        out[o + "mlp.up_proj.weight"] = fc1[f:]
        out[o + "mlp.down_proj.weight"] = state[p + "mlp.linear_fc2.weight"]
    out["model.norm.weight"] = state["decoder.final_layernorm.weight"]
    if model_config.untie_embeddings_and_output_weights:
        out["lm_head.weight"] = state["output_layer.weight"][:vocab]
    return {k: v.detach().to(torch.float32).contiguous() for k, v in out.items()}


def megatron_to_llama(model, model_config: ModelConfig, *, vocab_size: int | None = None,
                      rope_scaling: dict | None = None, **extra: Any):
    """In-memory float32 `LlamaForCausalLM` (sdpa) with the weights of a TP=1/PP=1 model or state dict."""
    from transformers import LlamaForCausalLM

    vocab = model_config.vocab_size if vocab_size is None else int(vocab_size)
    weights = megatron_state_to_llama(_plain_state(model), model_config, vocab)
    config = llama_config(model_config, vocab, rope_scaling, **extra)
    config._attn_implementation = "sdpa"
    with torch.device("cpu"):
        hf = LlamaForCausalLM(config)
    hf = hf.to(torch.float32)
    missing, unexpected = hf.load_state_dict(weights, strict=False)
    # With tied embeddings lm_head.weight is the embedding itself.
    missing = [m for m in missing if not (m == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise RuntimeError(f"weight mapping mismatch: missing {missing}, unexpected {unexpected}")
    if config.tie_word_embeddings:
        hf.tie_weights()
    return hf.eval()


def hf_logits(hf_model, tokens: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
    """Logits of an HF causal LM at (possibly fractional) positions [s] or [b, s]."""
    if positions is not None:
        positions = positions.to(torch.float32)
        if positions.dim() == 1:
            positions = positions[None].expand(tokens.shape[0], -1)
    # An explicit mask stops transformers from treating non-unit position gaps as packing.
    mask = torch.ones_like(tokens)
    with torch.no_grad():
        return hf_model(input_ids=tokens, attention_mask=mask, position_ids=positions, use_cache=False).logits
