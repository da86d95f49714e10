"""Per-query attention scaling inside Megatron-Core: Llama 4's NoPE-layer temperature and SSMax.

Both rules multiply every logit of a query by a factor f(n), n the number of keys the query sees (and, for the
temperature, only on the NoPE layers, with n - 1 as its position): the same as multiplying that query vector by
f(n) before the core attention. n is i + 1 for token index i under causal attention; under an attention mask
(data.document_masking's block-diagonal causal mask) n is counted from the mask, so both rules restart at every
document as its positions do, and a document packed with others is scaled as when it is alone. This
holds for every core attention (Megatron's, torch SDPA's, Transformer Engine's), for TP (heads split, f does
not depend on the head) and for PP (each layer knows its global layer_number). The factors come from
megatron_ext.positions (nope_interleave, ssmax), which state the rules and cite the papers.

Reaches into Megatron-Core (checked against megatron-core 0.16.1 and 0.19.2):
- TransformerLayer.self_attention.core_attention (a submodule) gets a forward pre-hook; Attention calls it
  with the query [sq, b, heads, head_dim] as first positional argument and the attention mask (None, or bool
  [b or 1, 1, sq, sk], True = hidden) as the fourth or as `attention_mask` (also under activation recompute).
- TransformerConfig.no_rope_freq (Megatron's own NoPE layers; a per-layer 0/1 list after __post_init__).
"""

from __future__ import annotations

import functools
import weakref

import torch

from megatron_ext.positions import attention_temperature, ssmax_factor


_last_keys: tuple[weakref.ref, torch.Tensor] | None = None


def keys_seen(seq_len: int, attention_mask: torch.Tensor | None, device: torch.device) -> torch.Tensor:
    """[seq_len, 1] (causal, no mask) or [seq_len, b]: how many keys each query sees (at least 1)."""
    global _last_keys
    if attention_mask is None:
        return torch.arange(1, seq_len + 1, device=device).unsqueeze(-1)
    # Every layer of a microbatch gets the same mask object: count once per mask.
    if _last_keys is None or _last_keys[0]() is not attention_mask:
        hidden = attention_mask if attention_mask.dtype == torch.bool else attention_mask != 0
        keys = (~hidden).sum(-1)[:, 0].transpose(0, 1).clamp(min=1)  # [b, 1, sq, sk] → [sq, b]
        _last_keys = (weakref.ref(attention_mask), keys)
    return _last_keys[1]


def query_scale(keys: torch.Tensor, *, nope_layer: bool, temperature: tuple[float, float] | None,
                ssmax_scale: float | None, window: int | None = None) -> torch.Tensor | None:
    """The factor each query is multiplied by on one layer (the shape of `keys`, see keys_seen), or None when it
    is 1 everywhere; on a sliding-window layer SSMax counts only the window's window + 1 keys."""
    factor = None
    if ssmax_scale is not None:
        factor = ssmax_factor(keys if window is None else keys.clamp(max=window + 1), ssmax_scale)
    if temperature is not None and nope_layer:
        tuned = attention_temperature(keys - 1, *temperature)  # the query's position: keys before it
        factor = tuned if factor is None else factor * tuned
    return factor


def _scale_query(layer_number: int, settings: dict, module, args, kwargs):
    """Forward pre-hook of a core attention: the query times its per-token factor."""
    query = args[0] if args else kwargs["query"]
    mask = args[3] if len(args) > 3 else kwargs.get("attention_mask")
    nope = bool(settings["nope"][layer_number - 1])
    factor = query_scale(keys_seen(query.shape[0], mask, query.device), nope_layer=nope,
                         temperature=settings["temperature"], ssmax_scale=settings["ssmax_scale"],
                         window=settings["windows"][layer_number - 1])
    if factor is None:
        return None
    query = query * factor.to(query.dtype)[:, :, None, None]
    if args:
        return (query, *args[1:]), kwargs
    return args, {**kwargs, "query": query}


def install_query_scaling(gpt, *, temperature: tuple[float, float] | None, ssmax_scale: float | None,
                          windows: list[int | None] | None = None) -> None:
    """Register the per-query scaling on every local layer of `gpt` (a FloatPositionGPTModel); `windows`: each
    layer's sliding window (None = full attention)."""
    if temperature is None and ssmax_scale is None:
        return
    nope = gpt.config.no_rope_freq or [0] * gpt.config.num_layers
    settings = {"nope": list(nope), "temperature": temperature, "ssmax_scale": ssmax_scale,
                "windows": list(windows or [None] * gpt.config.num_layers)}
    for layer in gpt.decoder.layers:
        layer.self_attention.core_attention.register_forward_pre_hook(
            functools.partial(_scale_query, layer.layer_number, settings), with_kwargs=True)
    gpt.scales_queries = True
