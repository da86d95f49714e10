"""Per-query attention scaling inside Megatron-Core: Llama 4's NoPE-layer temperature and SSMax.

Both rules multiply every logit of the query at token index i by a factor f(i) (and, for the temperature,
only on the NoPE layers): the same as multiplying that query vector by f(i) before the core attention, which
holds for every core attention (Megatron's, torch SDPA's, Transformer Engine's), for TP (heads split, f does
not depend on the head) and for PP (each layer knows its global layer_number). The factors come from
megatron_ext.positions (nope_interleave, ssmax), which state the rules and cite the papers.

Reaches into Megatron-Core (checked against megatron-core 0.16.1 and 0.19.2):
- TransformerLayer.self_attention.core_attention (a submodule) gets a forward pre-hook; Attention calls it
  with the query [sq, b, heads, head_dim] as first positional argument (also under activation recompute).
- TransformerConfig.no_rope_freq (Megatron's own NoPE layers; a per-layer 0/1 list after __post_init__).
"""

from __future__ import annotations

import functools

import torch

from megatron_ext.positions import attention_temperature, ssmax_factor


def query_scale(seq_len: int, *, nope_layer: bool, temperature: tuple[float, float] | None,
                ssmax_scale: float | None, device: torch.device) -> torch.Tensor | None:
    """[seq_len] factor each query is multiplied by on one layer, or None when it is 1 everywhere."""
    index = torch.arange(seq_len, device=device)
    factor = None
    if ssmax_scale is not None:
        factor = ssmax_factor(index + 1, ssmax_scale)  # n = i + 1 keys under causal attention
    if temperature is not None and nope_layer:
        tuned = attention_temperature(index, *temperature)
        factor = tuned if factor is None else factor * tuned
    return factor


def _scale_query(layer_number: int, settings: dict, module, args, kwargs):
    """Forward pre-hook of a core attention: the query times its per-token factor."""
    query = args[0] if args else kwargs["query"]
    nope = bool(settings["nope"][layer_number - 1])
    factor = query_scale(query.shape[0], nope_layer=nope, temperature=settings["temperature"],
                         ssmax_scale=settings["ssmax_scale"], device=query.device)
    if factor is None:
        return None
    query = query * factor.to(query.dtype).view(-1, *[1] * (query.dim() - 1))
    if args:
        return (query, *args[1:]), kwargs
    return args, {**kwargs, "query": query}


def install_query_scaling(gpt, *, temperature: tuple[float, float] | None, ssmax_scale: float | None) -> None:
    """Register the per-query scaling on every local layer of `gpt` (a FloatPositionGPTModel)."""
    if temperature is None and ssmax_scale is None:
        return
    nope = gpt.config.no_rope_freq or [0] * gpt.config.num_layers
    settings = {"nope": list(nope), "temperature": temperature, "ssmax_scale": ssmax_scale}
    for layer in gpt.decoder.layers:
        layer.self_attention.core_attention.register_forward_pre_hook(
            functools.partial(_scale_query, layer.layer_number, settings), with_kwargs=True)
    gpt.scales_queries = True
