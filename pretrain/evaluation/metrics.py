"""Per-position loss, cliff, context gain G(C), attention entropy ratio (PosAug paper §3).

Position convention: a span of L tokens gives L-1 losses; index i is the loss of the
token at position t = i + 1 given tokens 0..i. Metrics are stated in target positions t:
cliff compares t in (w, L) with t in [64, w] (the queries at i >= w are exactly those whose
RoPE positions training never produced); G(C) averages over targets t in [W, C) with W the
sliding window (512 in the paper).
"""

from __future__ import annotations

import math
from typing import Iterable, Iterator

import torch

from .arguments import GAIN_METHODS, MAX_BATCH_TOKENS
from .ranges import cliff_in_start
from .scorers import Scorer


def _batches(n: int, batch_size: int, desc: str, progress: bool) -> Iterator[tuple[int, int]]:
    """(start, stop) over n items, with a progress line on stderr when progress is on."""
    from pretrain.console import progress as progress_line

    for start in progress_line(range(0, n, max(1, batch_size)), desc=desc, enabled=progress):
        yield start, min(start + batch_size, n)


def auto_batch_size(length: int, max_batch_tokens: int = MAX_BATCH_TOKENS) -> int:
    """Spans per forward pass so that batch × length stays within the token budget."""
    return max(1, max_batch_tokens // max(1, length))


def per_position_loss(scorer: Scorer, spans: torch.Tensor, *, batch_size: int | None = None,
                      max_batch_tokens: int = MAX_BATCH_TOKENS,
                      progress: bool = False) -> torch.Tensor:
    """Loss [n, L-1] from one full-context causal pass per span at the scorer's evaluation positions."""
    n, length = spans.shape
    batch_size = batch_size or auto_batch_size(length, max_batch_tokens)
    rope = scorer.eval_positions(length)
    out = [scorer.token_losses(spans[a:b], rope).cpu() for a, b in _batches(n, batch_size, "spans", progress)]
    return torch.cat(out)


def _mean_curve(losses: torch.Tensor) -> torch.Tensor:
    return losses.double().mean(0) if losses.dim() == 2 else losses.double()


def span_cliffs(losses: torch.Tensor, window: int, *, in_start: int | None = None,
                ood_end: int | None = None) -> dict[str, torch.Tensor]:
    """Per span: mean loss at targets t in [in_start, w] ('in_dist') and in (w, ood_end) ('ood'), float64 [n]."""
    losses = losses.double()[None] if losses.dim() == 1 else losses.double()  # index i = target t = i + 1
    in_start = cliff_in_start(window) if in_start is None else in_start
    length = losses.shape[1] + 1
    ood_end = length if ood_end is None else min(ood_end, length)
    if not 1 <= in_start <= window:
        raise ValueError(f"in_start must be in [1, w={window}] (got {in_start})")
    if ood_end <= window + 1:
        raise ValueError(f"the cliff needs evaluation spans longer than w + 1 = {window + 1} tokens "
                         f"(got {length}); raise --lengths")
    return {"in_dist": losses[:, in_start - 1:window].mean(1), "ood": losses[:, window:ood_end - 1].mean(1)}


def cliff(losses: torch.Tensor, window: int, *, in_start: int | None = None,
          ood_end: int | None = None) -> dict[str, float]:
    """{'in_dist', 'ood', 'cliff'}: mean loss at targets t in (w, ood_end) minus t in [in_start, w]."""
    in_start = cliff_in_start(window) if in_start is None else in_start
    # every span has the same targets, so the mean of span means is the mean curve's mean
    spans = span_cliffs(losses, window, in_start=in_start, ood_end=ood_end)
    in_dist, ood = spans["in_dist"].mean().item(), spans["ood"].mean().item()
    return {"in_dist": in_dist, "ood": ood, "cliff": ood - in_dist, "in_start": in_start, "window": window}


def standard_error(values: torch.Tensor) -> float:
    """Standard error of the mean of `values` (sample std / sqrt(n)); NaN for fewer than two."""
    values = torch.as_tensor(values, dtype=torch.float64)
    return (values.std() / math.sqrt(values.numel())).item() if values.numel() > 1 else math.nan


def paired_reduction(baseline_cliffs: torch.Tensor, cliffs: torch.Tensor) -> tuple[float, float]:
    """(mean, standard error) of baseline minus method cliff, paired span by span (same tokens)."""
    difference = torch.as_tensor(baseline_cliffs, dtype=torch.float64) - torch.as_tensor(cliffs, dtype=torch.float64)
    return difference.mean().item(), standard_error(difference)


def per_span_cliffs(per_span: dict) -> torch.Tensor:
    """Cliff of each span (ood − in_dist, float64) from a record's stored {'in_dist': [...], 'ood': [...]}."""
    return (torch.tensor(per_span["ood"], dtype=torch.float64)
            - torch.tensor(per_span["in_dist"], dtype=torch.float64))


def in_distribution_penalty(in_dist: float, baseline_in_dist: float) -> float:
    """Relative increase of in-distribution loss over the baseline run's ((x - b) / b)."""
    return (in_dist - baseline_in_dist) / baseline_in_dist


@torch.no_grad()
def exact_window_losses(scorer: Scorer, spans: torch.Tensor, window: int, *, batch_size: int | None = None,
                        max_batch_tokens: int = MAX_BATCH_TOKENS,
                        progress: bool = False) -> torch.Tensor:
    """Loss [n, L-1] where target t >= window sees exactly the previous `window` tokens (NaN for t < window).

    Each target is predicted by its own forward pass over tokens [t - window, t) at the run's
    evaluation positions for a length-`window` sequence. A banded attention mask is not the
    same thing: with more than one layer the receptive field grows to layers × window.
    """
    n, length = spans.shape
    windows = spans.unfold(1, window + 1, 1)  # [n, L - window, window + 1]: context + target
    flat = windows.reshape(-1, window + 1)
    rope = scorer.eval_positions(window)
    batch_size = batch_size or auto_batch_size(window, max_batch_tokens)
    out = []
    for a, b in _batches(flat.shape[0], batch_size, "windows", progress):
        logits = scorer.next_token_logits(flat[a:b, :window], rope)
        out.append(torch.nn.functional.cross_entropy(logits.cpu(), flat[a:b, window], reduction="none"))
    losses = torch.full((n, length - 1), float("nan"))
    losses[:, window - 1:] = torch.cat(out).view(n, length - window)
    return losses


@torch.no_grad()
def kv_cache_window_losses(scorer: Scorer, spans: torch.Tensor, window: int, *, chunk: int | None = None,
                           batch_size: int | None = None,
                           max_batch_tokens: int = MAX_BATCH_TOKENS, progress: bool = False) -> torch.Tensor:
    """Loss [n, L-1] under the paper's approximation: KV cache cut to `window`, RoPE offset reset to its size."""
    n, length = spans.shape
    chunk = chunk or window
    batch_size = batch_size or auto_batch_size(length, max_batch_tokens)
    return torch.cat([scorer.kv_cache_losses(spans[a:b], window, chunk)
                      for a, b in _batches(n, batch_size, "kv-cache spans", progress)])


def context_gain(scorer: Scorer, spans: torch.Tensor, contexts: Iterable[int], *, window: int = 512,
                 method: str = "exact", chunk: int | None = None, batch_size: int | None = None,
                 max_batch_tokens: int = MAX_BATCH_TOKENS,
                 progress: bool = False) -> dict:
    """G(C) = mean over targets t in [window, C) of loss_window(t) - loss_C(t), per C.

    spans are [n, max C]; the evaluation at C uses the first C tokens of each span (one
    full-context pass at length C, with the evaluation positions for length C).
    """
    if method not in GAIN_METHODS:
        raise ValueError(f"context-gain method must be one of {GAIN_METHODS} (got {method!r})")
    contexts = sorted(set(int(c) for c in contexts))
    if not contexts or contexts[0] <= window:
        raise ValueError(f"every context length C must exceed the sliding window {window} (got {contexts})")
    if contexts[-1] > spans.shape[1]:
        raise ValueError(f"C = {contexts[-1]} exceeds the span length {spans.shape[1]}")
    if method == "kv_cache" and scorer.backend != "hf":
        raise ValueError(f"--gain-method kv_cache needs the hf backend (got {scorer.backend})")
    spans = spans[:, :contexts[-1]]
    if method == "exact":
        short = exact_window_losses(scorer, spans, window, batch_size=batch_size, max_batch_tokens=max_batch_tokens, progress=progress)
    else:
        short = kv_cache_window_losses(scorer, spans, window, chunk=chunk, batch_size=batch_size, max_batch_tokens=max_batch_tokens,
                                       progress=progress)
    values, full_loss, window_loss = {}, {}, {}
    for c in contexts:
        full = per_position_loss(scorer, spans[:, :c].contiguous(), batch_size=batch_size, max_batch_tokens=max_batch_tokens, progress=progress)
        a, b = full[:, window - 1:].double(), short[:, window - 1:c - 1].double()
        values[c] = (b - a).mean().item()
        full_loss[c], window_loss[c] = a.mean().item(), b.mean().item()
    result = {"method": method, "window": window, "values": values, "full_loss": full_loss,
              "window_loss": window_loss, "num_spans": int(spans.shape[0])}
    if method == "kv_cache":
        result["chunk"] = chunk or window
    return result


@torch.no_grad()
def attention_entropy_ratio(scorer: Scorer, spans: torch.Tensor, *, batch_size: int = 1,
                            progress: bool = False) -> dict[str, float]:
    """Mean per-head attention entropy at query positions >= w over positions 1..w-1 (layers, heads, spans)."""
    n, length = spans.shape
    w = scorer.train_window
    if length <= w:
        raise ValueError(f"entropy ratio needs spans longer than w = {w} (got {length})")
    rope = scorer.eval_positions(length)
    entropy = torch.cat([scorer.attention_entropy(spans[a:b], rope)
                         for a, b in _batches(n, batch_size, "entropy", progress)]).double()
    # Query 0 sees one key (entropy 0 by construction): leave it out of the in-distribution mean.
    in_dist, ood = entropy[:, 1:w].mean().item(), entropy[:, w:].mean().item()
    return {"in_dist": in_dist, "ood": ood, "ratio": ood / in_dist if in_dist > 0 else math.nan}
