"""The long-context recipes of production models, as rules (the Megatron wiring is in megatron_ext.model,
megatron_ext.sdpa_attention and megatron_ext.rope_hook).

- Sliding-window ("local") layers beside full ("global") ones: query i sees keys i - W .. i on a local layer
  (W = model.window_size, Megatron-Core's window_size (W, 0); HF's sliding_window counts W + 1 keys); every N-th
  layer is global (model.window_attn_skip_freq = N, Megatron-Core's: Gemma 3 (Gemma Team 2025) has N = 6, 5 local
  layers per global one; gpt-oss alternates, N = 2); None makes every layer local. Local layers never see a
  relative position beyond W, so only the global layers meet positions past the training window.
- A RoPE base per kind (model.rotary_base_local; Gemma 3: 10k local, 1M global) and RoPE or NoPE per kind:
  model.no_rope_freq = N gives the global layers no RoPE (RNoPE-SWA, Yang et al., arXiv 2501.18795).
- PosAug on the global layers only: positions.layer_mode=global scales the full-attention RoPE layers; the local
  layers keep the token's own position i.
- Masking composes with the window: a key is visible when the caller's mask (document masking's block-diagonal
  causal mask) AND the band allow it, so a local layer never crosses a document boundary either.
- Attention sinks (model.softmax_type, Megatron-Core's; gpt-oss, OpenAI 2025; "off-by-one", Miller 2023):
  softmax_j = exp(z_j) / (exp(s_h) + sum_k exp(z_k)) with a learned per-head s_h (learnable) or s_h = 0
  (off-by-one): a query may put weight on no key at all (StreamingLLM's sink, Xiao et al. 2023, learned).
- QK-norm (model.qk_layernorm, Megatron-Core's; Qwen3, OLMo 2, Gemma 3): RMSNorm over each head's q and k, with
  a learned weight per channel, before RoPE.
"""

from __future__ import annotations

import weakref

import torch


def band_mask(sq: int, sk: int, window: int, device: torch.device | str | None = None) -> torch.Tensor:
    """[sq, sk] boolean, True = hidden: query i (at key index sk - sq + i) sees keys i' - window .. i'."""
    query = torch.arange(sk - sq, sk, device=device)[:, None]
    key = torch.arange(sk, device=device)[None, :]
    return (key > query) | (key < query - window)


def zero_sinks(core: torch.nn.Module, rng_state: torch.Tensor) -> None:
    """After a core attention's construction: its learnable sinks start at 0 (off-by-one) and the CPU RNG is back at
    `rng_state`. Megatron draws each TP rank's own [heads / TP] sinks from the global stream, which would shift every
    weight built after them by the TP size (use_cpu_initialization otherwise gives the same weights for every TP)."""
    if core.config.softmax_type != "learnable":
        return
    torch.random.set_rng_state(rng_state)
    with torch.no_grad():
        core.softmax_offset.zero_()


_last_windowed: dict[int, tuple[object, torch.Tensor]] = {}


def windowed_mask(attention_mask: torch.Tensor | None, sq: int, sk: int, window: int,
                  device: torch.device) -> torch.Tensor:
    """The caller's mask (None = causal) with the band outside `window` hidden too ([b|1, 1, sq, sk], True = hidden);
    computed once per (mask, window): every local layer of a microbatch gets the same mask object."""
    tag = (sq, sk, str(device)) if attention_mask is None else weakref.ref(attention_mask)
    cached = _last_windowed.get(window)
    if cached is not None and (cached[0] == tag if attention_mask is None
                               else isinstance(cached[0], weakref.ref) and cached[0]() is attention_mask):
        return cached[1]
    band = band_mask(sq, sk, window, device)[None, None]
    if attention_mask is not None:
        hidden = attention_mask if attention_mask.dtype == torch.bool else attention_mask != 0
        band = band | hidden
    _last_windowed[window] = (tag, band)
    return band
