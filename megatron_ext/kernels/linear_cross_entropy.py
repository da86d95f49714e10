"""The output layer and the vocab-parallel cross-entropy in token chunks: no [tokens × vocab] logits tensor.

Megatron computes logits = h·Wᵀ for every token ([s, b, V/TP] in the parameters' dtype), then its cross-entropy
upcasts them to float32 ([s·b, V/TP] float32: 2.6 MB per token at a 50K vocabulary, twice with the softmax saved for
backward; its `cross_entropy_loss_fusion` 'native' implementation fuses the elementwise steps but upcasts the
same). Here the loss is computed for `chunk` tokens at a time and the logits of a chunk are dropped once its loss is
known; backward recomputes each chunk's logits from the saved log-sum-exp (one more h·Wᵀ matmul: memory bought with
compute). Gradients are Megatron's: the float32 softmax minus the one-hot target, times the incoming gradient, cast
to the parameters' dtype before the two matmuls (as autograd does through Megatron's `.float()`).

Layout contract: hidden [T, h] (this rank's full sequence: the caller gathers sequence-parallel shards and wraps the
input in Megatron's copy-to-TP region, as ColumnParallelLinear does), weight [V/TP, h] (this rank's vocab rows
[rank·V/TP, (rank+1)·V/TP)), target [T] (global vocab ids); returns the per-token loss [T] in float32. Under TP the
three per-chunk reductions are Megatron's (max, then predicted logit and sum of exponentials together).

The reference below is the same loss in plain torch (one rank, every logit at once).
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def linear_cross_entropy_reference(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per-token cross-entropy of logits hidden·weightᵀ (float32), one process."""
    return torch.nn.functional.cross_entropy((hidden @ weight.t()).float(), target, reduction="none")


def _reduce(tensor: torch.Tensor, op, group) -> torch.Tensor:
    if group is not None and dist.get_world_size(group) > 1:
        dist.all_reduce(tensor, op=op, group=group)
    return tensor


def _shard_target(target: torch.Tensor, vocab_start: int, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(local index clamped into this shard, whether the target lies outside it)."""
    outside = (target < vocab_start) | (target >= vocab_start + vocab_size)
    return (target - vocab_start).masked_fill(outside, 0), outside


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, target, group, chunk):
        rank = dist.get_rank(group) if group is not None and dist.get_world_size(group) > 1 else 0
        vocab_start = rank * weight.shape[0]
        local, outside = _shard_target(target, vocab_start, weight.shape[0])
        loss = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        lse = torch.empty_like(loss)
        for start in range(0, hidden.shape[0], chunk):
            rows = slice(start, start + chunk)
            logits = (hidden[rows] @ weight.t()).float()
            peak = _reduce(logits.max(dim=-1).values, dist.ReduceOp.MAX, group)
            logits -= peak[:, None]
            predicted = logits.gather(1, local[rows, None]).squeeze(1).masked_fill(outside[rows], 0.0)
            sums = _reduce(torch.cat((predicted, logits.exp_().sum(dim=-1))), dist.ReduceOp.SUM, group)
            predicted, sum_exp = sums.chunk(2)
            loss[rows] = torch.log(sum_exp) - predicted
            lse[rows] = peak + torch.log(sum_exp)
        ctx.save_for_backward(hidden, weight, local, outside, lse)
        ctx.chunk = chunk
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        hidden, weight, local, outside, lse = ctx.saved_tensors
        grad_hidden = torch.empty_like(hidden)
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        for start in range(0, hidden.shape[0], ctx.chunk):
            rows = slice(start, start + ctx.chunk)
            softmax = ((hidden[rows] @ weight.t()).float() - lse[rows, None]).exp_()
            index = torch.arange(softmax.shape[0], device=softmax.device)
            softmax[index, local[rows]] -= (~outside[rows]).float()
            grad_logits = (softmax * grad_loss[rows, None]).to(hidden.dtype)
            grad_hidden[rows] = grad_logits @ weight
            grad_weight += (grad_logits.t() @ hidden[rows]).float()
        return grad_hidden, grad_weight.to(weight.dtype), None, None, None


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, *,
                         group: dist.ProcessGroup | None = None, chunk: int | None = None) -> torch.Tensor:
    """Per-token loss [T] (float32) of vocab-parallel logits hidden·weightᵀ, computed `chunk` tokens at a time."""
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1] or target.shape != hidden.shape[:1]:
        raise ValueError(f"linear_cross_entropy needs hidden [T, h], weight [V, h], target [T] "
                         f"(got {list(hidden.shape)}, {list(weight.shape)}, {list(target.shape)})")
    # ~64 MiB of float32 logits per chunk unless told otherwise
    chunk = chunk or max(1, (1 << 24) // weight.shape[0])
    return _LinearCrossEntropy.apply(hidden, weight, target, group, int(chunk))
