"""The one hook that carries float positions into Megatron-Core's RoPE.

Stock `GPTModel._preprocess` builds rotary angles from `arange(seq_len)` through the
`lru_cache`d `RotaryEmbedding.forward` and ignores `position_ids`. `FloatPositionGPTModel`
rebuilds the angles from what the caller passes as `position_ids`:

- a tensor `[s]` (shared by the batch; emb `[s, 1, 1, d]`, the shape TE's fused RoPE takes),
- a tensor `[b, s]` (per sample; emb `[s, b, 1, d]`, unfused RoPE broadcasts it),
- a `RopePositions` (positions plus optional per-layer rows, replacement inverse
  frequencies, and a YaRN attention factor).

Per-layer positions travel as one `[num_layers, s, b|1, 1, d]` tensor through the
TransformerBlock (so activation recompute sees the same tensor) and a forward pre-hook on
each layer picks its own row by global `layer_number`, which also holds under pipeline
parallelism. Every pipeline stage computes its own angles, so the caller must pass the same
positions to every stage for a given microbatch. Under context parallelism the caller passes
this CP rank's slice of the full-length positions (`megatron_ext.context_parallel`), the same
zigzag slice as its tokens, so the angles here are already the rank's own.

Built with position_embedding_type="none" the model has no RoPE: NoPE ignores the positions;
with `alibi=True` they become the ALiBi bias -m_h·|p_i - p_j|, handed to every layer as
Megatron's `attention_bias` (see megatron_ext.alibi_attention for the core attention).
"""

from __future__ import annotations

# Reaches into Megatron-Core internals (checked against megatron-core 0.16.1 and 0.19.2):
# - GPTModel._preprocess (private, overridden): the only place where rotary angles are built
#   between the embedding and the decoder; overriding it keeps GPTModel.forward stock.
# - RotaryEmbedding.inv_freq, .rotary_interleaved, .seq_len_interpolation_factor
#   (attributes of self.rotary_pos_emb): the model's own frequencies and settings, so float
#   positions use exactly what arange positions would.
# - DotProductAttention / TEDotProductAttention .softmax_scale (attention_logits_scaled): the
#   one scalar both attention backends multiply the logits by; YaRN's factor goes there.

import contextlib
from typing import Iterator

import torch
from megatron.core.models.gpt.gpt_model import GPTModel

from megatron_ext.alibi import alibi_bias, alibi_slopes
from megatron_ext.positions import RopePositions


def rotary_angles(positions: torch.Tensor, inv_freq: torch.Tensor, *, interleaved: bool = False,
                  interpolation_factor: float | None = None) -> torch.Tensor:
    """RoPE angles in Megatron's layout: [s] -> [s, 1, 1, d]; [b, s] -> [s, b, 1, d]."""
    positions = positions.to(device=inv_freq.device, dtype=torch.float32)
    if interpolation_factor is not None:
        positions = positions / interpolation_factor
    positions = positions[:, None] if positions.dim() == 1 else positions.transpose(0, 1)
    freqs = positions[..., None] * inv_freq  # [s, b|1, d/2]
    if interleaved:
        emb = torch.stack((freqs, freqs), dim=-1).flatten(-2)
    else:
        emb = torch.cat((freqs, freqs), dim=-1)
    return emb[:, :, None, :]


def as_rope_positions(position_ids: torch.Tensor | RopePositions) -> RopePositions:
    """Wrap a plain position tensor; pass a RopePositions through."""
    if isinstance(position_ids, RopePositions):
        return position_ids
    return RopePositions(positions=position_ids)


class FloatPositionGPTModel(GPTModel):
    """GPTModel whose RoPE angles come from the given (float) positions instead of arange."""

    def __init__(self, *args, alibi: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.position_embedding_type not in ("rope", "none"):
            raise ValueError("FloatPositionGPTModel needs position_embedding_type 'rope' or 'none' (NoPE / ALiBi)")
        if alibi and self.position_embedding_type != "none":
            raise ValueError("ALiBi replaces RoPE: build it with position_embedding_type='none'")
        self.alibi = alibi
        if alibi:
            # This TP rank's heads; not persistent, so checkpoints match a NoPE/RoPE model's.
            tp_size, tp_rank = self.pg_collection.tp.size(), self.pg_collection.tp.rank()
            heads = self.config.num_attention_heads // tp_size
            slopes = alibi_slopes(self.config.num_attention_heads)[tp_rank * heads:(tp_rank + 1) * heads]
            self.register_buffer("alibi_slopes", slopes, persistent=False)
        if self.position_embedding_type == "rope":
            for layer in self.decoder.layers:
                layer.register_forward_pre_hook(_select_layer_angles, with_kwargs=True)

    def forward(self, input_ids, position_ids, attention_mask, *args, **kwargs):
        """GPTModel.forward; position_ids may be a float tensor [s] / [b, s] or a RopePositions."""
        if self.position_embedding_type == "none":
            return self._forward_without_rope(input_ids, position_ids, attention_mask, *args, **kwargs)
        inference = kwargs.get("inference_context") or kwargs.get("inference_params")
        if inference is not None and getattr(self, "scales_queries", False):
            raise ValueError("attention temperature / SSMax scale queries by token index, which Megatron's "
                             "KV-cache decoding does not pass: decode with megatron_ext.generation.greedy_generate")
        if inference is not None and (isinstance(position_ids, RopePositions)
                                      or (torch.is_tensor(position_ids) and position_ids.is_floating_point())):
            # Megatron's KV-cache decoding builds its angles from arange; it would drop these positions.
            raise ValueError("float RoPE positions cannot be combined with a Megatron inference_context "
                             "(KV-cache decoding uses integer positions); decode with "
                             "megatron_ext.generation.greedy_generate, which re-runs the sequence at these positions")
        if position_ids is None or inference is not None:
            return super().forward(input_ids, position_ids, attention_mask, *args, **kwargs)
        rope = as_rope_positions(position_ids)
        with attention_logits_scaled(self, rope.attention_factor ** 2):
            return super().forward(input_ids, rope, attention_mask, *args, **kwargs)

    def _forward_without_rope(self, input_ids, position_ids, attention_mask, *args, **kwargs):
        """NoPE: positions are ignored. ALiBi: they become every layer's attention bias."""
        if self.alibi:
            if position_ids is None:
                raise ValueError("an ALiBi model needs positions (position_ids) to build its attention bias")
            if kwargs.get("inference_context") is not None:
                raise ValueError("ALiBi models run full forwards only (no Megatron KV-cache inference): decode with "
                                 "megatron_ext.generation.greedy_generate")
            extra = dict(kwargs.get("extra_block_kwargs") or {})
            extra["attention_bias"] = self.alibi_bias_for(position_ids)
            kwargs["extra_block_kwargs"] = extra
        return super().forward(input_ids, None, attention_mask, *args, **kwargs)

    def alibi_bias_for(self, position_ids: torch.Tensor | RopePositions) -> torch.Tensor:
        """This rank's ALiBi bias [1|b, heads/TP, s, s] in the parameters' dtype."""
        rope = as_rope_positions(position_ids)
        if rope.layer_positions is not None or rope.inv_freq is not None or rope.attention_factor != 1.0:
            raise ValueError("per-layer positions and RoPE frequency scaling (positions.rope_scaling, "
                             "random_base) need model.position_embedding_type=rope")
        return alibi_bias(rope.positions, self.alibi_slopes).to(self.config.params_dtype)

    def _preprocess(self, input_ids, position_ids, decoder_input=None, inference_context=None,
                    packed_seq_params=None, padding_mask=None):
        rope = position_ids if isinstance(position_ids, RopePositions) else None
        # The embedding layer ignores position_ids for RoPE models; hand it a tensor anyway.
        output = super()._preprocess(
            input_ids, rope.positions if rope is not None else position_ids,
            decoder_input=decoder_input, inference_context=inference_context,
            packed_seq_params=packed_seq_params, padding_mask=padding_mask)
        if rope is None:
            return output
        if packed_seq_params is not None:
            raise ValueError("float RoPE positions do not support packed (THD) sequences")
        return (output[0], self.rotary_angles_for(rope)) + tuple(output[2:])

    def rotary_angles_for(self, rope: RopePositions) -> torch.Tensor:
        """Angles for all layers: [s, b|1, 1, d], or [num_layers, s, 1, 1, d] for per-layer positions."""
        rotary = self.rotary_pos_emb
        inv_freq = rotary.inv_freq if rope.inv_freq is None else rope.inv_freq
        inv_freq = inv_freq.to(device=rope.positions.device, dtype=torch.float32)
        kwargs = dict(interleaved=rotary.rotary_interleaved,
                      interpolation_factor=rotary.seq_len_interpolation_factor)
        if rope.layer_positions is None:
            return rotary_angles(rope.positions, inv_freq, **kwargs)
        if rope.layer_positions.shape[0] != self.config.num_layers:
            raise ValueError(f"layer_positions has {rope.layer_positions.shape[0]} rows; "
                             f"the model has {self.config.num_layers} layers")
        return torch.stack([rotary_angles(row, inv_freq, **kwargs) for row in rope.layer_positions])


def _select_layer_angles(layer, args, kwargs):
    """Forward pre-hook: give each layer its own row of per-layer angles."""
    emb = kwargs.get("rotary_pos_emb")
    if emb is not None and emb.dim() == 5:
        kwargs["rotary_pos_emb"] = emb[layer.layer_number - 1]
        return args, kwargs
    return None


@contextlib.contextmanager
def attention_logits_scaled(model: torch.nn.Module, factor: float) -> Iterator[None]:
    """Multiply every core attention's softmax scale by `factor` for the duration (YaRN).

    YaRN multiplies cos and sin by its attention factor t, i.e. q and k by t, i.e. the
    logits by t**2; scaling softmax_scale is the same thing for any attention backend.
    """
    if factor == 1.0:
        yield
        return
    modules = [m for m in model.modules() if hasattr(m, "softmax_scale") and m.softmax_scale is not None]
    originals = [m.softmax_scale for m in modules]
    for module in modules:
        module.softmax_scale = module.softmax_scale * factor
    try:
        yield
    finally:
        for module, original in zip(modules, originals):
            module.softmax_scale = original
