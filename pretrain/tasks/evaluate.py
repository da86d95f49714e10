"""Exact match and per-token accuracy per length, over any `model(tokens, positions) -> logits`.

Two metrics, as the papers report them: exact match of the whole answer under greedy decoding
(RFS Fig. 2, index warping Fig. 5) and per-token accuracy (Ruoss et al. Table 1: the fraction
of output tokens predicted correctly, averaged over test lengths). Our models decode
autoregressively, so per-token accuracy is teacher-forced: the share of answer tokens (and
`<eos>`) that are the argmax given the correct prefix. An example is an exact match iff its
per-token accuracy is 1.

Greedy decoding reproduces the answer exactly iff, fed the correct prefix, the model's argmax
is the next answer token at every answer position (induction over the answer). So one
teacher-forced forward per batch gives the greedy exact match of the whole batch, instead of
one forward per generated token; `greedy_decode` is the token-by-token reference (tests
check both agree). Positions come from `positions_for(T)` for the T model inputs of an
example: the strategy's inference rule (identity for RoPE/PosAug/ALiBi, RFS's evenly spaced
indices, warp's PI, RPE's sampled positions) evaluated for the example's full length.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable

import torch

from .generators import EOS, Example
from .source import evaluation_examples

LogitsFn = Callable[[torch.Tensor, Any], torch.Tensor]  # tokens [B, T], positions -> logits [B, T, V]
PositionsFn = Callable[[int], Any]  # T -> positions for T inputs (e.g. a float tensor [T])


@torch.no_grad()
def score(model: LogitsFn, examples: list[Example], positions_for: PositionsFn,
          batch_size: int = 256) -> list[tuple[int, int]]:
    """Per example: (answer tokens + `<eos>` predicted correctly given the correct prefix, their number)."""
    scores = [(0, 0)] * len(examples)
    # Same total size and same answer start: one batch, one position tensor, one slice.
    groups: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i, example in enumerate(examples):
        groups[(len(example.ids()), example.answer_start)].append(i)
    for (size, answer_start), indices in groups.items():
        positions = positions_for(size - 1)
        for start in range(0, len(indices), batch_size):
            chunk = indices[start:start + batch_size]
            ids = torch.tensor([examples[i].ids() for i in chunk])
            logits = model(ids[:, :-1], positions)
            hits = logits[:, answer_start - 1:].argmax(-1) == ids[:, answer_start:]
            for row, i in enumerate(chunk):
                scores[i] = (int(hits[row].sum()), hits.shape[1])
    return scores


def exact_match(model: LogitsFn, examples: list[Example], positions_for: PositionsFn,
                batch_size: int = 256) -> list[bool]:
    """Per example: does greedy decoding after the prompt produce exactly `answer <eos>`?"""
    return [right == total for right, total in score(model, examples, positions_for, batch_size)]


@torch.no_grad()
def greedy_decode(model: LogitsFn, prompt_ids: list[int], max_new_tokens: int,
                  positions_for: PositionsFn, stop: int = EOS) -> list[int]:
    """Token-by-token greedy continuation of `prompt_ids` (through `<sep>`), up to and including `stop`."""
    ids = list(prompt_ids)
    generated: list[int] = []
    for _ in range(max_new_tokens):
        logits = model(torch.tensor([ids]), positions_for(len(ids)))
        token = int(logits[0, -1].argmax())
        generated.append(token)
        ids.append(token)
        if token == stop:
            break
    return generated


@dataclass(frozen=True)
class LengthResult:
    """Exact-match count and answer-token count at one input length."""

    length: int
    correct: int
    total: int
    seen: bool
    tokens_correct: int = 0
    tokens_total: int = 0
    # Per held-out example (answer tokens right, answer tokens): every method of a seed sees the same examples, so
    # two methods' results pair example by example (pretrain.tasks.versus).
    example_tokens: tuple[tuple[int, int], ...] = ()

    @property
    def accuracy(self) -> float:
        """Fraction of exact matches."""
        return self.correct / self.total

    @property
    def se(self) -> float:
        """Binomial standard error sqrt(p(1 - p)/n)."""
        p = self.accuracy
        return math.sqrt(p * (1 - p) / self.total)

    @property
    def token_accuracy(self) -> float:
        """Fraction of answer tokens (and `<eos>`) predicted correctly, teacher-forced (Ruoss et al.)."""
        return self.tokens_correct / self.tokens_total if self.tokens_total else float("nan")

    def to_dict(self) -> dict:
        """JSON-ready, with accuracy, se and token_accuracy."""
        return {**asdict(self), "accuracy": self.accuracy, "se": self.se, "token_accuracy": self.token_accuracy}


def accuracy_by_length(model: LogitsFn, task: str, lengths: Iterable[int], count: int, seed: int,
                       positions_for: PositionsFn, train_lengths: tuple[int, int],
                       batch_size: int = 256) -> list[LengthResult]:
    """Exact match and per-token accuracy of `count` held-out examples at each length; `seen` marks the
    training range."""
    lo, hi = train_lengths
    results = []
    for length in lengths:
        scores = score(model, evaluation_examples(task, length, count, seed), positions_for, batch_size)
        results.append(LengthResult(length, sum(right == total for right, total in scores), len(scores),
                                    lo <= length <= hi, sum(right for right, _ in scores),
                                    sum(total for _, total in scores), tuple(scores)))
    return results


def without_example_scores(lengths: list[dict]) -> list[dict]:
    """Length records less their per-example scores: what results.json keeps and a re-evaluation is compared on."""
    return [{k: v for k, v in length.items() if k != "example_tokens"} for length in lengths]


def summarize(results: list[LengthResult]) -> dict[str, dict[str, float] | None]:
    """Mean exact match over seen and over unseen lengths, each with its binomial standard error, and the
    mean per-token accuracy over the same lengths (`token_accuracy`, Ruoss et al.'s metric).

    The mean weighs every length equally; its SE is sqrt(sum_l p_l(1 - p_l)/n_l) / #lengths
    (independent binomials per length).
    """
    out: dict[str, dict[str, float] | None] = {}
    for name, group in (("seen", [r for r in results if r.seen]), ("unseen", [r for r in results if not r.seen])):
        if not group:
            out[name] = None
            continue
        mean = sum(r.accuracy for r in group) / len(group)
        se = math.sqrt(sum(r.se ** 2 for r in group)) / len(group)
        out[name] = {"accuracy": mean, "se": se, "lengths": len(group),
                     "token_accuracy": sum(r.token_accuracy for r in group) / len(group)}
    return out
