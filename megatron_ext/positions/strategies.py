"""Position-building kernels: pure tensor functions, no Python loops over tokens or samples."""

from __future__ import annotations

import torch


def scaled_positions(seq_len: int, alpha: float, device: torch.device) -> torch.Tensor:
    """alpha * [0, 1, ..., seq_len - 1] in float32 (PosAug, PI, head warping)."""
    positions = torch.arange(seq_len, dtype=torch.float32, device=device)
    return positions if alpha == 1.0 else positions * alpha


def _padding(lengths: torch.Tensor, seq_len: int) -> torch.Tensor:
    """[b, s] bool: True at j >= lengths[b] (the right padding of row b)."""
    j = torch.arange(seq_len, device=lengths.device)
    return j >= lengths.unsqueeze(-1)


def rfs_train_positions(uniforms: torch.Tensor, max_position: int,
                        lengths: torch.Tensor | None = None) -> torch.Tensor:
    """Random float sampling: U[0, 1) draws [..., s] sorted along the last dim and scaled by L.

    With `lengths` [b] (uniforms [b, s]): row b's first lengths[b] draws, sorted and scaled by L,
    then L for each padding token."""
    # Non-decreasing always; strictly increasing unless two float32 draws coincide
    # (probability ~ s^2 / 2^25 per sequence; the tied tokens then share a position).
    if lengths is not None:
        # 1.0 sorts after every U[0, 1) draw, so the n_b real draws come first.
        uniforms = uniforms.masked_fill(_padding(lengths, uniforms.shape[-1]), 1.0)
    return uniforms.sort(dim=-1).values * max_position


def rfs_eval_positions(seq_len: int, train_seq_len: int, max_position: int,
                       device: torch.device) -> torch.Tensor:
    """RFS evaluation positions L * (2i - 1) / (2 * max(n_train, n_eval)), i = 1..n."""
    i = torch.arange(1, seq_len + 1, dtype=torch.float64, device=device)
    # float64 then cast: exact midpoints of the partition for any length.
    return (max_position * (2 * i - 1) / (2 * max(train_seq_len, seq_len))).to(torch.float32)


def rpe_positions(keys: torch.Tensor, seq_len: int, lengths: torch.Tensor | None = None) -> torch.Tensor:
    """Sorted distinct integers from {0..L-1}: the seq_len largest of L uniform keys [..., L].

    With `lengths` [b] (keys [b, L]): row b holds the lengths[b] largest of its keys' indices,
    sorted, then L for each padding token."""
    # The indices of the seq_len largest of L i.i.d. uniform keys form a uniformly
    # random seq_len-subset: a batched, on-device sample without replacement.
    chosen = keys.topk(seq_len, dim=-1, sorted=False).indices
    if lengths is not None:
        # The n_b largest keys are among the seq_len largest: rank the chosen keys (descending)
        # and keep ranks < n_b. Starting from the same topk keeps full-length rows identical
        # to the lengths=None result, even where float32 keys tie.
        order = keys.gather(-1, chosen).argsort(dim=-1, descending=True, stable=True)
        rank = order.argsort(dim=-1)
        chosen = chosen.masked_fill(rank >= lengths.unsqueeze(-1), keys.shape[-1])
    return chosen.sort(dim=-1).values.to(torch.float32)


def skew(x: torch.Tensor, function: str) -> torch.Tensor:
    """Tail-warping skew f: [0, 1] -> [0, 1] with f(0) = 0, f(1) = 1 ('sqrt' or 'beta_2_5')."""
    if function == "sqrt":
        return torch.sqrt(x)
    if function == "beta_2_5":
        # Closed-form CDF of Beta(2, 5): I_x(2, 5) = 1 - (1 - x)^5 (1 + 5x).
        return 1.0 - (1.0 - x).pow(5) * (1.0 + 5.0 * x)
    raise ValueError(f"unknown tail function {function!r} (choose sqrt or beta_2_5)")


def warp_positions(uniforms: torch.Tensor, seq_len: int, *, p_head: float, p_tail: float,
                   head_alphas: torch.Tensor | None, head_alpha_fixed: float | None,
                   tail_function: str, lengths: torch.Tensor | None = None) -> torch.Tensor:
    """Index warping from uniforms [..., 2] (kind, head alpha): head w.p. p_head, tail w.p. p_tail, else j.

    The tail is l·f(j / l) with l = seq_len, or with `lengths` [b] (uniforms [b, 2]) l = lengths[b]
    and l·f(1) = l for each padding token."""
    j = torch.arange(seq_len, dtype=torch.float32, device=uniforms.device)
    choice = uniforms[..., :1]
    if head_alpha_fixed is not None:
        head = j * head_alpha_fixed
    else:
        assert head_alphas is not None
        n = head_alphas.numel()
        index = (uniforms[..., 1] * n).long().clamp_(max=n - 1)
        head = head_alphas[index].unsqueeze(-1) * j
    # l is the sequence length (Eq. 8 of the warping paper: l * f(j / l), j = 0..l-1).
    if lengths is None:
        length = float(seq_len)
        tail = length * skew(j / length, tail_function)
    else:
        length = lengths.to(torch.float32).unsqueeze(-1)
        # j / l > 1 past the row's end: clamping keeps padding at l (beta_2_5 explodes beyond 1).
        tail = length * skew((j / length).clamp(max=1.0), tail_function)
    warped = torch.where(choice < p_head + p_tail, tail, j)
    return torch.where(choice < p_head, head, warped)
