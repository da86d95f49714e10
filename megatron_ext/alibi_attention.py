"""ALiBi inside Megatron-Core's attention: a layer spec whose core attention adds the bias.

The bias (megatron_ext.alibi, computed once per forward by FloatPositionGPTModel from the
sampler's positions) reaches every layer as Megatron's own `attention_bias` argument of
TransformerBlock → TransformerLayer → Attention → core attention. What each backend does with it:

- local (CPU and GPU): `ALiBiDotProductAttention`, a DotProductAttention that adds the bias
  to the scaled scores before the causal mask and softmax (stock DotProductAttention asserts
  that no bias is given).
- Transformer Engine (GPU): Megatron's TEDotProductAttention already hands `attention_bias`
  to TE as `core_attention_bias_type="post_scale_bias"`, so the stock TE spec is used. TE's
  own `core_attention_bias_type="alibi"` is not: it builds -m·(i + s_k - s_q - j) from
  integer indices and cannot carry RFS/RPE/PosAug float positions.

Private attributes reached (megatron-core 0.16.1, checked):
- `DotProductAttention.scale_mask_softmax` (instance attribute set in __init__): wrapped so the
  bias is added to the scores it receives; the class offers no other point between the
  scaled QK^T and the softmax.
"""

from __future__ import annotations

import copy

import torch
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.spec_utils import ModuleSpec

from megatron_ext.local_attention import zero_sinks


class _BiasedSoftmax(torch.nn.Module):
    """Adds `bias` (set per forward) to the scaled scores, then runs Megatron's masked softmax."""

    def __init__(self, softmax: torch.nn.Module) -> None:
        super().__init__()
        self.softmax = softmax
        self.bias: torch.Tensor | None = None

    def forward(self, scores: torch.Tensor, mask, *args):
        """scores [b, np, sq, sk] (already × softmax_scale) + bias [1|b, np, sq, sk]."""
        if self.bias is not None:
            scores = scores + self.bias.to(scores.dtype)
        return self.softmax(scores, mask, *args)


class ALiBiDotProductAttention(DotProductAttention):
    """Megatron's local core attention with an additive attention bias (ALiBi)."""

    def __init__(self, config, *args, **kwargs) -> None:
        rng_state = torch.random.get_rng_state()
        super().__init__(config, *args, **kwargs)
        zero_sinks(self, rng_state)  # learnable sinks: the same initial weights for every TP size
        if config.apply_query_key_layer_scaling:
            # Megatron divides the scores by layer_number before the softmax multiplies it
            # back; a bias added in between would be scaled too.
            raise ValueError("ALiBi attention does not support apply_query_key_layer_scaling")
        self.scale_mask_softmax = _BiasedSoftmax(self.scale_mask_softmax)

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):
        """DotProductAttention.forward with `attention_bias` added to the scores."""
        if attention_bias is not None and attention_bias.shape[-2:] != (query.shape[0], key.shape[0]):
            raise ValueError(f"attention_bias covers {tuple(attention_bias.shape[-2:])} query x key "
                             f"positions; the attention has {(query.shape[0], key.shape[0])}")
        self.scale_mask_softmax.bias = attention_bias
        try:
            return super().forward(query, key, value, attention_mask, attn_mask_type=attn_mask_type,
                                   attention_bias=None, packed_seq_params=packed_seq_params)
        finally:
            self.scale_mask_softmax.bias = None


def alibi_layer_spec(transformer_impl: str, **spec_kwargs) -> ModuleSpec:
    """The GPT layer spec for ALiBi: local core attention swapped; TE's stock spec (bias as post_scale_bias)."""
    from megatron.core.models.gpt import gpt_layer_specs

    if transformer_impl == "transformer_engine":
        # Fail before anything imports Transformer Engine: on CPU it cannot run at all.
        if not torch.cuda.is_available():
            raise RuntimeError("model.position_embedding_type=alibi with model.transformer_impl="
                               "transformer_engine needs a CUDA GPU; on CPU use model.transformer_impl=local")
        return gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec(**spec_kwargs)
    if transformer_impl != "local":
        raise ValueError(f"unknown transformer_impl {transformer_impl!r} (choose local or transformer_engine)")
    spec = copy.deepcopy(gpt_layer_specs.get_gpt_layer_local_spec(**spec_kwargs))
    spec.submodules.self_attention.submodules.core_attention = ALiBiDotProductAttention
    return spec
