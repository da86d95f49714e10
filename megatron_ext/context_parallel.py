"""Context parallelism for float RoPE positions: Megatron's zigzag split and the CP loss reduction.

Megatron splits a sequence into 2 * cp chunks and gives CP rank r chunks r and 2 * cp - 1 - r,
which balances causal-attention work (`megatron.core.utils.get_batch_on_this_cp_rank`). Tokens,
labels, loss mask and positions are all split with that one utility. Positions are built at
full length first and sliced afterwards: a position depends on where its token sits in the
whole sequence (RFS sorts draws over all of it, warping scales by the full length).

Loss: each CP rank holds part of every sequence, so the per-microbatch mean needs the masked
token count of the whole sequence (all-reduced over the CP group). Megatron's schedule
multiplies a two-tuple loss by the CP size and DDP averages gradients over DP x CP ranks, so
backpropagating local_sum / total_count on every CP rank gives the gradient of the
full-sequence mean.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist

from megatron_ext.positions import RopePositions


def cp_size(cp_group: dist.ProcessGroup | None) -> int:
    """Size of the context-parallel group (1 without one)."""
    return 1 if cp_group is None else cp_group.size()


def check_divisible(seq_len: int, cp: int) -> None:
    """ValueError unless the zigzag split applies: seq_len divisible by 2 * CP."""
    if seq_len % (2 * cp):
        raise ValueError(f"model.seq_length ({seq_len}) must be divisible by 2 × parallel.context_parallel_size "
                         f"({2 * cp}) for the zigzag context-parallel split; change either")


def slice_batch(batch: dict[str, torch.Tensor], cp_group: dist.ProcessGroup) -> dict[str, torch.Tensor]:
    """This CP rank's zigzag slice of [b, s] tensors (tokens, labels, loss_mask), Megatron's order."""
    from megatron.core.utils import get_batch_on_this_cp_rank

    check_divisible(next(iter(batch.values())).shape[1], cp_size(cp_group))
    return get_batch_on_this_cp_rank(dict(batch), cp_group=cp_group)


def slice_positions(rope: RopePositions, cp_group: dist.ProcessGroup) -> RopePositions:
    """This CP rank's slice of full-length positions: the same zigzag chunks as its tokens."""

    def cut(tensor: torch.Tensor | None) -> torch.Tensor | None:
        if tensor is None:
            return None
        # The sequence is the last dim of every position tensor ([s], [b, s], [L, s], [L, b, s]);
        # as [rows, s] it has the [b, s] layout Megatron's utility slices.
        rows = tensor.reshape(-1, tensor.shape[-1])
        return slice_batch({"positions": rows}, cp_group)["positions"].reshape(*tensor.shape[:-1], -1)

    return dataclasses.replace(rope, positions=cut(rope.positions), layer_positions=cut(rope.layer_positions))


def masked_mean_loss(per_token_loss: torch.Tensor, loss_mask: torch.Tensor,
                     cp_group: dist.ProcessGroup | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss this CP rank backpropagates, detached full-sequence masked mean to report)."""
    mask = loss_mask.float()
    local_sum = (per_token_loss.float() * mask).sum()
    count = mask.sum()
    if cp_size(cp_group) > 1:
        count = count.detach().clone()
        dist.all_reduce(count, group=cp_group)
    loss = local_sum / count.clamp(min=1.0)
    reported = loss.detach().clone()
    if cp_size(cp_group) > 1:
        dist.all_reduce(reported, group=cp_group)
    return loss, reported
