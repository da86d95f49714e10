"""`model.cross_entropy_fusion_impl: chunked`: the training loss without a [tokens × vocab] logits tensor.

GPTModel._postprocess computes `logits = output_layer(hidden)` and then `compute_language_model_loss(labels,
logits)`. On a model built with the chunked loss, a forward that has labels makes the output layer hand back a
`DeferredLogits` (its input, prepared for the vocab shard exactly as ColumnParallelLinear prepares it, and the
weight) instead of logits, and the model's `compute_language_model_loss` turns that into the per-token loss with
megatron_ext.kernels.linear_cross_entropy (token chunks, logits recomputed in backward). A forward without labels
(evaluation's logits, generation) runs the output layer as Megatron wrote it. The loss and every gradient equal
Megatron's path (tests/megatron_ext/test_chunked_loss.py, TP = 1 and TP = 2).

Reaches into Megatron-Core (public names, checked against megatron-core 0.16.1 only: the 0.17.1-0.19.2 wheels were
not reachable from the machine this was written on):
- GPTModel._postprocess calls `self.output_layer(hidden, weight=..., runtime_gather_output=...)` and passes what it
  returns, unchanged, as `logits` to `self.compute_language_model_loss(labels, logits)` when labels are given (no
  multi-token prediction, no config logger); both names are replaced on the built instance, not on the class.
- ColumnParallelLinear attributes tp_group, sequence_parallel, weight; tensor_parallel.mappings
  copy_to_tensor_model_parallel_region / gather_from_sequence_parallel_region (what its forward applies).
"""

from __future__ import annotations

import types
from dataclasses import dataclass

import torch
from megatron.core.tensor_parallel.mappings import (
    copy_to_tensor_model_parallel_region,
    gather_from_sequence_parallel_region,
)

from megatron_ext.kernels.linear_cross_entropy import linear_cross_entropy


@dataclass
class DeferredLogits:
    """What the output layer would have multiplied: hidden [s, b, h] (this vocab shard's input) and weight [V/TP, h]."""

    hidden: torch.Tensor
    weight: torch.Tensor


def install_chunked_loss(gpt: torch.nn.Module, *, chunk: int | None = None) -> None:
    """Make `gpt` compute its training loss by linear_cross_entropy (see the module docstring)."""
    if not getattr(gpt, "post_process", False):
        return  # no output layer on this pipeline stage
    if gpt.config.mtp_num_layers is not None:
        raise ValueError("model.cross_entropy_fusion_impl=chunked does not cover multi-token prediction")
    layer = gpt.output_layer
    stock_forward, stock_loss = layer.forward, gpt.compute_language_model_loss
    armed = {"on": False}

    def arm(module, args, kwargs):
        armed["on"] = kwargs.get("labels") is not None and kwargs.get("inference_context") is None

    def output_forward(self, input_, weight=None, runtime_gather_output=None):
        if not armed["on"] or runtime_gather_output:
            return stock_forward(input_, weight=weight, runtime_gather_output=runtime_gather_output)
        armed["on"] = False  # one loss per forward
        weight = self.weight if weight is None else weight
        if self.tp_group.size() > 1:
            input_ = (gather_from_sequence_parallel_region(input_, group=self.tp_group) if self.sequence_parallel
                      else copy_to_tensor_model_parallel_region(input_, group=self.tp_group))
        return DeferredLogits(input_, weight), None

    def language_model_loss(self, labels, logits):
        if not isinstance(logits, DeferredLogits):
            return stock_loss(labels, logits)
        s, b, h = logits.hidden.shape
        target = labels.transpose(0, 1).reshape(-1)  # [b, s] -> tokens in [s, b] order, as the hidden states
        loss = linear_cross_entropy(logits.hidden.reshape(s * b, h), logits.weight, target,
                                    group=layer.tp_group, chunk=chunk)
        return loss.view(s, b).transpose(0, 1).contiguous()

    gpt.register_forward_pre_hook(arm, with_kwargs=True)
    layer.forward = types.MethodType(output_forward, layer)
    gpt.compute_language_model_loss = types.MethodType(language_model_loss, gpt)
