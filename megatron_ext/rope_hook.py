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

Packed (THD) sequences, the GPU path of document masking (`packed_seq_params` with qkv_format
"thd", one packed row [1, T] of documents bounded by cu_seqlens): the caller passes positions
for every packed token ([T] or [1, T], each document's own, e.g. the sampler's per-document
positions flattened) and the hook hands Megatron per-token angles [T, 1, 1, d]; Megatron's
unfused THD RoPE (`_apply_rotary_pos_emb_thd`, the case freqs.size(0) == cu_seqlens[-1])
indexes them per token. Shared-α strategies may instead pass one row [n >= max_seqlen] that
every document uses from its start (α·arange): those angles suit the fused THD kernel too.
Per-token angles need apply_rope_fusion=False and context_parallel_size=1 (refused otherwise);
megatron-core 0.16.1 to 0.19.2 have the per-token case (tests pass on 0.16.1, 0.17.1, 0.19.2).

Built with position_embedding_type="none" the model has no RoPE: NoPE ignores the positions;
with `alibi=True` they become the ALiBi bias -m_h·|p_i - p_j|, handed to every layer as
Megatron's `attention_bias` (see megatron_ext.alibi_attention for the core attention).
"""

from __future__ import annotations

# Reaches into Megatron-Core internals (checked against megatron-core 0.16.1, 0.17.1, 0.18.2 and 0.19.2;
# megatron_ext.versions lists them and names a missing one when the model is built):
# - GPTModel._preprocess (private, overridden): the only place where rotary angles are built
#   between the embedding and the decoder; overriding it keeps GPTModel.forward stock. Its
#   optional parameters are read from its signature, so only those it takes are passed on.
# - RotaryEmbedding.inv_freq, .rotary_interleaved, .seq_len_interpolation_factor
#   (attributes of self.rotary_pos_emb): the model's own frequencies and settings, so float
#   positions use exactly what arange positions would.
# - DotProductAttention / TEDotProductAttention .softmax_scale (attention_logits_scaled): the
#   one scalar both attention backends multiply the logits by; YaRN's factor goes there.
# - megatron.core.models.common.embeddings.rope_utils._apply_rotary_pos_emb_thd (not called,
#   relied on): it indexes angles per token when their length is cu_seqlens[-1] (0.16.1-0.19.2).

import contextlib
import functools
import inspect
from typing import Iterator

import torch
from megatron.core.models.gpt.gpt_model import GPTModel

from megatron_ext.alibi import alibi_bias, alibi_slopes
from megatron_ext.positions import RopePositions
from megatron_ext.versions import resolve


@functools.cache
def _preprocess_parameters() -> frozenset[str]:
    """The parameter names of the installed GPTModel._preprocess (MissingReachError when it is gone)."""
    return frozenset(inspect.signature(resolve("gpt_preprocess")).parameters)


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
        _preprocess_parameters()  # the reach this class overrides: a clear error now, not ignored positions later
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
        self.local_inv_freq: torch.Tensor | None = None  # sliding-window layers' own RoPE base (set_local_rope)
        self.local_layers: list[bool] = []

    def set_local_rope(self, inv_freq: torch.Tensor, local_layers: list[bool]) -> None:
        """Rotate the sliding-window layers (local_layers[l] True, global index) by `inv_freq` instead of the
        model's (model.rotary_base_local); every layer then gets its own row of angles."""
        if len(local_layers) != self.config.num_layers:
            raise ValueError(f"local_layers has {len(local_layers)} entries; the model has {self.config.num_layers}")
        self.local_inv_freq, self.local_layers = inv_freq, list(local_layers)

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
        if self.local_inv_freq is not None and inference is not None:
            raise ValueError("model.rotary_base_local gives local layers their own RoPE base, which Megatron's "
                             "KV-cache decoding does not build: decode with megatron_ext.generation.greedy_generate")
        if position_ids is None and self.local_inv_freq is not None:
            position_ids = torch.arange(input_ids.shape[-1], device=input_ids.device, dtype=torch.float32)
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
        optional = dict(decoder_input=decoder_input, inference_context=inference_context,
                        packed_seq_params=packed_seq_params, padding_mask=padding_mask)
        output = super()._preprocess(
            input_ids, rope.positions if rope is not None else position_ids,
            **{k: v for k, v in optional.items() if k in _preprocess_parameters() or v is not None})
        if rope is None:
            return output
        if packed_seq_params is not None:
            return (output[0], self.packed_rotary_angles_for(rope, packed_seq_params)) + tuple(output[2:])
        return (output[0], self.rotary_angles_for(rope)) + tuple(output[2:])

    def packed_rotary_angles_for(self, rope: RopePositions, packed_seq_params) -> torch.Tensor:
        """THD angles: per token [T, 1, 1, d] (or [num_layers, T, 1, 1, d]), or one shared row [n, 1, 1, d]."""
        if packed_seq_params.qkv_format != "thd":
            raise ValueError(f"float RoPE positions with packed_seq_params need qkv_format='thd' "
                             f"(got {packed_seq_params.qkv_format!r})")
        if self.config.context_parallel_size > 1:
            raise ValueError("float RoPE positions on packed (THD) sequences need context_parallel_size=1")
        if rope.inv_freq is not None and rope.inv_freq.dim() == 2:
            raise ValueError("per-sample inverse frequencies (random_base per_sample) cannot be packed (THD): "
                             "use positions.granularity=per_step")
        positions = rope.positions.reshape(-1)
        layers = rope.layer_positions
        if layers is not None:
            layers = layers.reshape(layers.shape[0], -1)
        # One device sync per forward, as Megatron's own THD RoPE makes (cu_seqlens.tolist()).
        total = int(packed_seq_params.cu_seqlens_q[-1])
        if positions.numel() == total:
            if self.config.apply_rope_fusion:
                raise ValueError("per-token RoPE angles on packed (THD) sequences need apply_rope_fusion=False "
                                 "(the fused THD kernel indexes angles from each sequence's start)")
        elif rope.positions.dim() != 1 or positions.numel() < int(packed_seq_params.max_seqlen_q):
            raise ValueError(f"packed (THD) positions must cover every packed token ({total}) or be one row of at "
                             f"least max_seqlen_q={int(packed_seq_params.max_seqlen_q)} shared by every sequence "
                             f"(got shape {list(rope.positions.shape)})")
        return self.rotary_angles_for(RopePositions(positions, layer_positions=layers, inv_freq=rope.inv_freq,
                                                    attention_factor=rope.attention_factor))

    def rotary_angles_for(self, rope: RopePositions) -> torch.Tensor:
        """Angles for all layers: [s, b|1, 1, d], or [num_layers, s, 1, 1, d] for per-layer positions."""
        rotary = self.rotary_pos_emb
        inv_freq = rotary.inv_freq if rope.inv_freq is None else rope.inv_freq
        inv_freq = inv_freq.to(device=rope.positions.device, dtype=torch.float32)
        kwargs = dict(interleaved=rotary.rotary_interleaved,
                      interpolation_factor=rotary.seq_len_interpolation_factor)
        if self.local_inv_freq is not None:
            return self._per_kind_angles(rope, inv_freq, kwargs)
        if rope.layer_positions is None:
            return rotary_angles(rope.positions, inv_freq, **kwargs)
        if rope.layer_positions.shape[0] != self.config.num_layers:
            raise ValueError(f"layer_positions has {rope.layer_positions.shape[0]} rows; "
                             f"the model has {self.config.num_layers} layers")
        return torch.stack([rotary_angles(row, inv_freq, **kwargs) for row in rope.layer_positions])


    def _per_kind_angles(self, rope: RopePositions, global_inv_freq: torch.Tensor, kwargs: dict) -> torch.Tensor:
        """[num_layers, s, b|1, 1, d]: local layers rotate by local_inv_freq, global ones by the model's."""
        if rope.inv_freq is not None:
            raise ValueError("replacement RoPE frequencies (random_base, positions.rope_scaling) would drop the local "
                             "layers' own base (model.rotary_base_local): drop them")
        rows = rope.layer_positions if rope.layer_positions is not None else [rope.positions] * self.config.num_layers
        if len(rows) != self.config.num_layers:
            raise ValueError(f"layer_positions has {len(rows)} rows; the model has {self.config.num_layers} layers")
        local = self.local_inv_freq.to(device=rope.positions.device, dtype=torch.float32)
        return torch.stack([rotary_angles(row, local if is_local else global_inv_freq, **kwargs)
                            for row, is_local in zip(rows, self.local_layers)])


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
