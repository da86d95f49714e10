"""Export of the long-context recipes (megatron_ext.local_attention) to transformers architectures that compute the
same logits: QK-norm → Qwen3 (`Qwen3ForCausalLM`: RMSNorm over each head's q and k before RoPE, q_norm / k_norm);
sliding-window layers without QK-norm → Qwen2 (`Qwen2ForCausalLM`, its q/k/v biases zero unless the model has
them). Both take per-layer windows as `layer_types` ("sliding_attention" / "full_attention") with one
`sliding_window`: transformers' sliding-window mask lets query i see keys j with i - j < sliding_window, so
sliding_window = model.window_size + 1 (Megatron's (W, 0) window covers W keys before the query and the query's own).

Refused, one line each naming the option: attention sinks (model.softmax_type; gpt-oss is the only transformers
architecture with sinks and it is mixture-of-experts), a per-kind RoPE base (model.rotary_base_local; one rope_theta
in Qwen2/Qwen3), NoPE layers beside QK-norm or windows (model.no_rope_freq), and what Qwen3 lacks of ours (SSMax,
p-RoPE, Llama 3 RoPE scaling, q/k/v biases beside QK-norm, interleaved RoPE). Checked with transformers 5.24.0.
"""

from __future__ import annotations

from typing import Any

import torch

from megatron_ext.model import ModelConfig
from pretrain.hf.weight_map import megatron_to_hf_names


def uses_qwen(model_config: ModelConfig) -> bool:
    """True when the model has QK-norm or sliding-window layers (exported as Qwen3 / Qwen2, not Llama)."""
    return bool(getattr(model_config, "qk_layernorm", False)) or getattr(model_config, "window_size", None) is not None


def check_recipe_exportable(model_config: ModelConfig) -> None:
    """Refuse the recipe options no export target expresses (ValueError, one line naming the option)."""
    softmax = getattr(model_config, "softmax_type", "vanilla")
    if softmax != "vanilla":
        raise ValueError(f"cannot export: attention sinks (model.softmax_type={softmax}) have no dense transformers "
                         "architecture (gpt-oss's are mixture-of-experts); evaluate with --backend megatron")
    if not uses_qwen(model_config):
        return
    what = "QK-norm / sliding-window layers (exported as Qwen3 / Qwen2)"
    for field, why in (("rotary_base_local", "a per-kind RoPE base"), ("no_rope_freq", "NoPE layers"),
                       ("ssmax_scale", "SSMax"), ("use_rope_scaling", "Llama 3 RoPE scaling"),
                       ("rotary_interleaved", "interleaved RoPE")):
        if getattr(model_config, field) not in (None, False):
            raise ValueError(f"cannot export: {why} (model.{field}) beside {what}; evaluate with --backend megatron")
    if model_config.rope_proportion < 1.0:
        raise ValueError(f"cannot export: p-RoPE (model.rope_proportion) beside {what}; evaluate with --backend "
                         "megatron")
    if model_config.qk_layernorm and model_config.add_qkv_bias:
        raise ValueError("cannot export: q/k/v biases (model.add_qkv_bias) beside QK-norm: Qwen3's attention_bias "
                         "also biases the output projection")


def qwen_config(model_config: ModelConfig, vocab_size: int, rope_scaling=None, **extra: Any):
    """`Qwen3Config` (QK-norm) or `Qwen2Config` (windows only) with our architecture, windows and RoPE."""
    from transformers import Qwen2Config, Qwen3Config

    from pretrain.hf.rope import hf_rope_fields

    check_recipe_exportable(model_config)
    local = model_config.local_layers()
    windows = {} if model_config.window_size is None else dict(
        use_sliding_window=True, sliding_window=int(model_config.window_size) + 1, max_window_layers=0)
    fields = dict(
        vocab_size=int(vocab_size), hidden_size=model_config.hidden_size,
        intermediate_size=model_config.ffn_hidden_size, num_hidden_layers=model_config.num_layers,
        num_attention_heads=model_config.num_attention_heads, num_key_value_heads=model_config.num_query_groups,
        head_dim=model_config.kv_channels, hidden_act="silu", rms_norm_eps=model_config.layernorm_epsilon,
        tie_word_embeddings=not model_config.untie_embeddings_and_output_weights, attention_dropout=0.0,
        initializer_range=model_config.init_method_std,
        layer_types=["sliding_attention" if is_local else "full_attention" for is_local in local], **windows,
        **hf_rope_fields(model_config, rope_scaling),
        **{"bos_token_id": None, "eos_token_id": None, "pad_token_id": None, **extra})
    if model_config.qk_layernorm:
        return Qwen3Config(attention_bias=False, **fields)
    return Qwen2Config(**fields)


def megatron_to_qwen(model_or_state, model_config: ModelConfig, *, vocab_size: int | None = None,
                     rope_scaling=None, **extra: Any):
    """In-memory float32 `Qwen3ForCausalLM` / `Qwen2ForCausalLM` (sdpa) with a TP=1/PP=1 model's weights."""
    from transformers import AutoModelForCausalLM

    raw = getattr(model_or_state, "module", model_or_state)
    raw = raw.state_dict() if isinstance(raw, torch.nn.Module) else dict(raw)
    plain = {k.removeprefix("module."): v for k, v in raw.items() if torch.is_tensor(v) and "_extra_state" not in k}
    vocab = model_config.vocab_size if vocab_size is None else int(vocab_size)
    config = qwen_config(model_config, vocab, rope_scaling, **extra)
    state = dict(megatron_to_hf_names(plain, model_config, vocab))
    d = model_config.kv_channels
    for layer in range(model_config.num_layers):
        ours, theirs = f"decoder.layers.{layer}.self_attention.", f"model.layers.{layer}.self_attn."
        if model_config.qk_layernorm:
            state[theirs + "q_norm.weight"] = plain[ours + "q_layernorm.weight"]
            state[theirs + "k_norm.weight"] = plain[ours + "k_layernorm.weight"]
        elif not model_config.add_qkv_bias:  # Qwen2 always has q/k/v biases: zero ones add nothing
            for proj, heads in (("q", model_config.num_attention_heads), ("k", model_config.num_query_groups),
                                ("v", model_config.num_query_groups)):
                state[theirs + f"{proj}_proj.bias"] = torch.zeros(heads * d)
    state = {k: v.detach().to(torch.float32).contiguous() for k, v in state.items()}
    with torch.device("cpu"):
        hf = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").to(torch.float32)
    missing, unexpected = hf.load_state_dict(state, strict=False)
    missing = [m for m in missing if not (m == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise RuntimeError(f"weight mapping mismatch: missing {missing}, unexpected {unexpected}")
    if config.tie_word_embeddings:
        hf.tie_weights()
    return hf.eval()


def card_architecture(model_config: ModelConfig) -> tuple[str, list[str]]:
    """The export README's architecture phrase and its lines on the recipes (pretrain.hf.model_card)."""
    name = ("Qwen3 (`Qwen3ForCausalLM`)" if model_config.qk_layernorm
            else "Qwen2 (`Qwen2ForCausalLM`, zero q/k/v biases)")
    lines = []
    if model_config.qk_layernorm:
        lines.append("- QK-norm: RMSNorm of each head's q and k before RoPE (q_norm / k_norm).")
    if model_config.window_size is not None:
        local = sum(model_config.local_layers())
        lines.append(f"- Sliding-window attention on {local} of {model_config.num_layers} layers (`layer_types`), "
                     f"{model_config.window_size + 1} keys each (`sliding_window`); the others attend to all keys.")
    return f"A {name}", lines
