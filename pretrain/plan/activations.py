"""Activation memory by the method of Korthikanti et al., "Reducing Activation Recomputation in Large
Transformer Models" (arXiv 2205.05198, Sec. 4 and Table 2), the method behind Megatron-LM's
megatron/training/theoretical_memory_usage.py, redone tensor by tensor for this project's layer.

Megatron's file assumes a GELU MLP, LayerNorm and dropout (34·sbh bytes per layer, its
`18 + 4·ffn/h` form, plus 5·a·s²·b for materialised attention scores). Our layer is RMSNorm, GQA,
flash/SDPA attention (no s² term), SwiGLU and no dropout, so the count is redone for it, listing what
each op keeps for its backward pass (s = sequence, b = micro-batch, h = hidden, f = ffn_hidden_size,
q = heads·kv_channels, kv = query_groups·kv_channels, t = TP, a = activation bytes: 2 for bf16/fp8,
4 for fp32):

  each RMSNorm + the linear after it (twice per layer):
      transformer_engine: LayerNormLinear keeps its input and the normalised output: 2a·sbh
      local: torch's RMSNorm upcasts to fp32 (its weight is fp32) and keeps the fp32 input and the
             fp32 normalised value; the linear keeps the weighted output:  (8 + a)·sbh
  attention: q and k after RoPE a·sb(q + kv)/t; v is a view of the fused QKV output, which it keeps
      alive: a·sb(q + 2kv)/t; the attention output (kept by SDPA/flash) and the output projection's
      contiguous input: 2a·sbq/t; softmax log-sum-exp: 4·b·heads·s/t (fp32)
  MLP: fc1 output (SwiGLU input) 2a·sbf/t; the gate half made contiguous, its SiLU and the product
      (fc2 input): 3a·sbf/t
  dropout: none (hidden/attention dropout are 0 in every shipped config); masks of 1 byte per
      element are added when a config sets hidden_dropout > 0.

The local terms were read off the saved-tensor inventory of a real layer on CPU
(benchmarks/bench_plan_memory.py checks the total); the transformer_engine terms assume TE keeps the
same attention/MLP tensors and fuses the norm into its linear, and have not been checked on a GPU.
The norm terms split over TP only with sequence parallelism (Table 2's "sequence parallel" row).

Recompute (Table 2 and Megatron's TransformerConfig semantics):
  selective: core attention is recomputed; with flash attention that drops only its log-sum-exp
  full/uniform n: the input (a·sbh, /t with SP) of every group of n layers is kept, and the backward
      pass rebuilds one group (n layers) at a time
  full/block n: the first n layers of each stage keep only their input; the rest keep everything
Pipeline (1F1B, Narayanan et al. 2021): stage r holds min(microbatches, PP − r) micro-batches in
flight; interleaving multiplies the first stage's PP by 1 + (PP − 1)/(PP·VP), Megatron's factor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Layer:
    """One transformer layer's shapes and the run's activation layout."""

    seq: int
    micro_batch: int
    hidden: int
    ffn: int
    heads: int
    q_size: int  # heads × kv_channels
    kv_size: int  # query_groups × kv_channels
    tp: int = 1
    sequence_parallel: bool = False
    act_bytes: int = 2
    impl: str = "transformer_engine"  # or local
    hidden_dropout: float = 0.0

    @property
    def norm_bytes(self) -> int:
        """Bytes per element one RMSNorm and its following linear keep."""
        return 2 * self.act_bytes if self.impl == "transformer_engine" else 8 + self.act_bytes


def layer_bytes(layer: Layer) -> float:
    """Bytes one layer keeps for its backward pass (no recompute)."""
    s, b, t, a = layer.seq, layer.micro_batch, layer.tp, layer.act_bytes
    sp = t if layer.sequence_parallel else 1
    norms = 2 * layer.norm_bytes * s * b * layer.hidden / sp
    attention = a * s * b * ((layer.q_size + layer.kv_size) + (layer.q_size + 2 * layer.kv_size)
                             + 2 * layer.q_size) / t
    mlp = a * s * b * 5 * layer.ffn / t
    masks = 2 * s * b * layer.hidden / sp if layer.hidden_dropout > 0 else 0.0
    return norms + attention + _lse(layer) + mlp + masks


def _lse(layer: Layer) -> float:
    return 4 * layer.micro_batch * layer.heads * layer.seq / layer.tp


def layer_input_bytes(layer: Layer) -> float:
    """Bytes of one layer's input: all that full recompute keeps per recompute unit."""
    sp = layer.tp if layer.sequence_parallel else 1
    return layer.act_bytes * layer.seq * layer.micro_batch * layer.hidden / sp


def stage_bytes(layer: Layer, layers: int, granularity: str | None = None, method: str | None = None,
                num_layers: int | None = None) -> float:
    """Bytes one micro-batch leaves on a stage of `layers` layers, at the peak of its backward pass."""
    full = layer_bytes(layer)
    if granularity is None:
        return layers * full
    if granularity == "selective":
        return layers * (full - _lse(layer))
    if method == "uniform":
        units = math.ceil(layers / num_layers)
        return units * layer_input_bytes(layer) + num_layers * full
    if method == "block":
        recomputed = min(num_layers, layers)
        return recomputed * layer_input_bytes(layer) + (layers - recomputed) * full + (full if recomputed else 0)
    raise ValueError(f"recompute method {method!r}: expected uniform or block")


def in_flight(pp: int, stage: int, microbatches: int, vp: int | None) -> float:
    """Micro-batches whose activations a pipeline stage holds at once (1F1B / interleaved)."""
    if pp == 1:
        return 1
    if vp is not None:
        return pp * (1 + (pp - 1) / (pp * vp))  # Megatron's interleaving penalty (first stage, the worst)
    return min(microbatches, pp - stage)


def embedding_bytes(seq: int, micro_batch: int) -> int:
    """The first stage's token ids (int64) kept by the embedding lookup for its backward."""
    return 8 * seq * micro_batch


def logits_bytes(layer: Layer, vocab: int) -> float:
    """The last stage's final norm, output layer and loss for one micro-batch.

    The final RMSNorm + output layer keep what a layer's norm + linear keeps; Megatron's
    vocab-parallel cross entropy works in fp32 and keeps the softmax (4·sbV/t) for the backward pass;
    a 16-bit run also holds its a-byte logits while the fp32 copy is made; labels (int64) and mask.
    """
    s, b, t, a = layer.seq, layer.micro_batch, layer.tp, layer.act_bytes
    sp = t if layer.sequence_parallel else 1
    norm = layer.norm_bytes * s * b * layer.hidden / sp
    per_logit = 4 + (a if a < 4 else 0)
    return norm + per_logit * s * b * vocab / t + 9 * s * b
