"""Document masking: packed windows whose positions restart at every document, for every strategy.

A window holds several documents, each ended by an EOD token (data_prep shards, Megatron's
GPTDataset). As Megatron's `reset_position_ids` / `reset_attention_mask`, the EOD token is the
last token of its document and the next document starts right after it; the window's first
token starts a document even when that document began in an earlier window (a document longer
than the window is seen as the part of it that the window holds, positions from 0).

Per-document rules (the sampler's `training(..., documents=)` applies them):
- none / random_base: i − start (random_base keeps the step's inverse frequencies).
- PosAug: α·(i − start) with the step's one α shared by every document, rank and layer
  (PosAug paper §3: one α per step), and per-layer modes built on the same offsets.
- RFS (Random Float Sampling, randomized position paper's "n sorted uniforms in [0, L)"):
  a document of length n takes n sorted draws scaled by L (positions.max_position).
- Randomized PE (Ruoss et al. 2023): a document of length n takes a uniformly random
  n-subset of {0..L-1}, sorted. The documents of one window take disjoint slices of one
  random ordering of {0..L-1} (the L keys' descending order), so each is a uniform
  n-subset and no two documents of a window share a position.
- Index warping (warping paper, Eq. 8): each document draws head / tail / identity and its
  head α for itself; the tail is l·f(j / l) with l = the document's length, j = i − start.
Draws are keyed as today (seed, step, global sample index; rng.py), and per document by its
ordinal in the window, so every rank computes them without communication. A window with no
EOD gets exactly the positions of the plain path (tested).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .strategies import skew


@dataclass(frozen=True)
class Documents:
    """Where the documents of each window of a microbatch lie: `index` [b, s], each token's document ordinal."""

    index: torch.Tensor  # long [b, s], non-decreasing along s, 0 at the first token

    @classmethod
    def from_tokens(cls, tokens: torch.Tensor, eod: int, lengths: torch.Tensor | None = None) -> "Documents":
        """Documents of input `tokens` [b, s]: a new one after every EOD; with `lengths` [b], padding is its own."""
        return cls(document_index(tokens, eod, lengths))

    def to(self, device: torch.device | str) -> "Documents":
        """The same documents on `device`."""
        return Documents(self.index.to(device))

    @property
    def starts(self) -> torch.Tensor:
        """long [b, s]: the window index at which each token's document starts."""
        j = torch.arange(self.index.shape[-1], device=self.index.device).expand_as(self.index)
        first = torch.ones_like(self.index[..., :1], dtype=torch.bool)
        is_start = torch.cat([first, self.index[..., 1:] != self.index[..., :-1]], dim=-1)
        return torch.where(is_start, j, torch.zeros_like(j)).cummax(dim=-1).values

    @property
    def offsets(self) -> torch.Tensor:
        """long [b, s]: i − start, each token's index within its document."""
        return torch.arange(self.index.shape[-1], device=self.index.device) - self.starts

    @property
    def lengths(self) -> torch.Tensor:
        """long [b, s]: the length (within the window) of each token's document."""
        s = self.index.shape[-1]
        j = torch.arange(s, device=self.index.device).expand_as(self.index)
        last = torch.ones_like(self.index[..., :1], dtype=torch.bool)
        is_end = torch.cat([self.index[..., 1:] != self.index[..., :-1], last], dim=-1)
        ends = torch.where(is_end, j, torch.full_like(j, s)).flip(-1).cummin(dim=-1).values.flip(-1)
        return ends - self.starts + 1

    def attention_mask(self) -> torch.Tensor:
        """bool [b, 1, s, s], True where query i may NOT see key j (j > i or another document): Megatron's convention.

        One mask per microbatch, shared by every layer and head (block-diagonal causal)."""
        s = self.index.shape[-1]
        causal = torch.ones(s, s, dtype=torch.bool, device=self.index.device).triu(1)
        other_document = self.index[:, :, None] != self.index[:, None, :]
        return (other_document | causal).unsqueeze(1)


def document_index(tokens: torch.Tensor, eod: int, lengths: torch.Tensor | None = None) -> torch.Tensor:
    """long [b, s]: how many EOD inputs precede each token (EOD ends its document); padding j >= lengths[b] apart."""
    is_eod = (tokens == eod).long()
    index = is_eod.cumsum(dim=-1) - is_eod
    if lengths is not None:
        # Right padding (task examples) is a document of its own: the example's draws then use
        # the example's length, as the sampler's `lengths` path does without document masking.
        j = torch.arange(tokens.shape[-1], device=tokens.device)
        padding = j >= lengths.to(tokens.device).unsqueeze(-1)
        index = torch.where(padding, index.max(dim=-1, keepdim=True).values + 1, index)
    return index


def sort_within_documents(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """`values` [b, s] in [0, 1) sorted ascending within each document (a segmented sort, no loops)."""
    # index + u keeps documents in place and orders within them; float64 holds both exactly
    # (a float32 u has 24 significant bits, the index < 2^29 leaves room).
    keyed = index.to(torch.float64) + values.to(torch.float64)
    return (keyed.sort(dim=-1).values - index.to(torch.float64)).to(values.dtype)


def rfs_document_positions(uniforms: torch.Tensor, documents: Documents, max_position: int) -> torch.Tensor:
    """RFS per document: uniforms [s] or [b, s] → each document's own draws sorted, × L; float32 [b, s]."""
    uniforms = uniforms.expand_as(documents.index)
    return sort_within_documents(uniforms, documents.index) * max_position


def rpe_document_positions(keys: torch.Tensor, documents: Documents) -> torch.Tensor:
    """Randomized PE per document: keys [L] or [b, L] → disjoint sorted n-subsets of {0..L-1}; float32 [b, s]."""
    s = documents.index.shape[-1]
    max_position = keys.shape[-1]
    # Token j takes the j-th largest key's index: a document [start, start + n) takes n of them.
    order = keys.topk(s, dim=-1, sorted=True).indices.expand_as(documents.index)
    keyed = documents.index * max_position + order
    return (keyed.sort(dim=-1).values - documents.index * max_position).to(torch.float32)


def warp_document_positions(draws: torch.Tensor, documents: Documents, *, p_head: float, p_tail: float,
                            head_alphas: torch.Tensor | None, head_alpha_fixed: float | None,
                            tail_function: str) -> torch.Tensor:
    """Index warping per document from draws [s, 2] or [b, s, 2] (row d: document d's kind and head α); [b, s]."""
    index = documents.index
    draws = draws.expand(*index.shape, 2)
    per_token = draws.gather(-2, index.unsqueeze(-1).expand(*index.shape, 2))  # [b, s, 2]: its document's
    j = documents.offsets.to(torch.float32)
    length = documents.lengths.to(torch.float32)
    choice = per_token[..., 0]
    if head_alpha_fixed is not None:
        head = j * head_alpha_fixed
    else:
        assert head_alphas is not None
        n = head_alphas.numel()
        head = head_alphas[(per_token[..., 1] * n).long().clamp_(max=n - 1)] * j
    tail = length * skew(j / length, tail_function)
    warped = torch.where(choice < p_head + p_tail, tail, j)
    return torch.where(choice < p_head, head, warped)
