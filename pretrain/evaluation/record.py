"""`evaluate`: the requested evaluations of one model, as one JSON-ready record.

What `eval run` (cli.py) and `eval all` (all_runs.py) both call; it sits below both so that
neither imports the other for it.
"""

from __future__ import annotations

import datetime

from . import metrics, passkey as retrieval, report
from .data import TokenStream, eval_spans
from .scorers import Scorer


PAPER_GAIN_WINDOW, PAPER_WINDOW = 512, 2048  # the paper's G(C) window is a quarter of its training window


def default_gain_window(train_window: int) -> int:
    """G(C)'s sliding window when none is given: the paper's 512, or w/4 below its w = 2048 (as the CPU presets)."""
    return PAPER_GAIN_WINDOW if train_window >= PAPER_WINDOW else max(1, train_window // 4)


def evaluate(scorer: Scorer, stream: TokenStream, lengths: list[int], num_spans: int, *,
             batch_size: int | None = None, max_batch_tokens: int = metrics.MAX_BATCH_TOKENS,
             in_start: int | None = None, gain_contexts: list[int] | None = None,
             gain_window: int | None = None, gain_method: str = "exact", kv_chunk: int | None = None,
             passkey_lengths: list[int] | None = None, passkey_n: int = 100, ruler_lengths: list[int] | None = None,
             ruler_n: int = 50, tokenizer=None, entropy_spans: int = 0, label: str | None = None,
             seed: int = 0, progress: bool = False) -> dict:
    """Run the requested evaluations on one model; returns the JSON-ready record."""
    info = scorer.info
    rope = scorer.rope_scaling
    record: dict = {
        "run": info.name, "label": label or report.default_label(info.name), "seed": info.seed,
        "strategy": info.strategy, "parameters": info.parameters, "train_window": info.train_window,
        "source": info.source, "backend": scorer.backend, "run_info": info.extra,
        "data": stream.source, "num_spans": num_spans,
        "rope_scaling": None if rope is None else rope.kind, "rope_scaling_factor": None if rope is None else rope.factor,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "lengths": {},
    }
    for key in ("size", "method"):  # a Megatron run's table names: `eval report` pairs by them
        if info.extra.get(key):
            record[key] = info.extra[key]
    w = info.train_window
    for length in lengths:
        spans = eval_spans(stream, num_spans, length)
        losses = metrics.per_position_loss(scorer, spans, batch_size=batch_size,
                                           max_batch_tokens=max_batch_tokens, progress=progress)
        curve = losses.double().mean(0)
        entry = {"loss": curve.mean().item(), "curve": [round(v, 6) for v in curve.tolist()]}
        if length > w + 1:
            entry["cliff"] = metrics.cliff(losses, w, in_start=in_start)
            per_span = metrics.span_cliffs(losses, w, in_start=entry["cliff"]["in_start"])
            # per span, so `eval report` pairs a method with its baseline span by span (as reproduce does)
            entry["per_span"] = {k: [round(v, 6) for v in per_span[k].tolist()] for k in ("in_dist", "ood")}
            se = metrics.standard_error(per_span["ood"] - per_span["in_dist"])
            entry["cliff"]["se"] = se if se == se else None  # NaN (one span) is not JSON
        record["lengths"][str(length)] = entry
    if gain_contexts:
        spans = eval_spans(stream, num_spans, max(gain_contexts))
        record["context_gain"] = metrics.context_gain(
            scorer, spans, gain_contexts, window=default_gain_window(w) if gain_window is None else gain_window,
            method=gain_method, chunk=kv_chunk,
            batch_size=batch_size, max_batch_tokens=max_batch_tokens, progress=progress)
    if entropy_spans:
        length = max(lengths)
        record["entropy"] = dict(metrics.attention_entropy_ratio(
            scorer, eval_spans(stream, entropy_spans, length), progress=progress), length=length, spans=entropy_spans)
    for task, task_lengths, n, fn in (("passkey", passkey_lengths, passkey_n, retrieval.passkey),
                                     ("ruler_niah", ruler_lengths, ruler_n, retrieval.ruler_niah)):
        if task_lengths:
            if tokenizer is None:
                raise ValueError(f"{task} needs a tokenizer: pass --tokenizer")
            record[task] = {str(L): fn(scorer, tokenizer, L, n, seed=seed, progress=progress) for L in task_lengths}
    return record
