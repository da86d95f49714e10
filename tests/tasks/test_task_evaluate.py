"""Greedy exact-match evaluation on models whose behaviour is known by construction. Runtime: ~3 s."""

import math

import pytest
import torch

from pretrain.tasks.evaluate import LengthResult, accuracy_by_length, exact_match, greedy_decode, score, summarize
from pretrain.tasks.generators import EOS, SEP, TOKEN_ID, VOCAB_SIZE, Example
from pretrain.tasks.source import evaluation_examples


def copier(max_length: int | None = None, broken_symbol: str | None = None):
    """A model that solves copy by construction: after <sep>, emit the k-th source symbol, then <eos>.

    With max_length it emits <eos> immediately for longer inputs; with broken_symbol it stops
    (emits <eos>) as soon as the symbol it should copy is that one.
    """
    broken = TOKEN_ID[broken_symbol] if broken_symbol else None

    def model(tokens: torch.Tensor, positions) -> torch.Tensor:
        batch, length = tokens.shape
        logits = torch.zeros(batch, length, VOCAB_SIZE)
        for b in range(batch):
            row = tokens[b].tolist()
            if SEP not in row:
                continue
            sep = row.index(SEP)
            source = row[3:sep]  # <bos> Copy : x1 .. xn <sep>
            for t in range(sep, length):
                k = t - sep
                target = source[k] if k < len(source) else EOS
                if (max_length is not None and len(source) > max_length) or target == broken:
                    target = EOS
                logits[b, t, target] = 1.0
        return logits

    return model


def arange(length: int) -> torch.Tensor:
    return torch.arange(length, dtype=torch.float32)


def test_a_perfect_copier_scores_one_at_every_length():
    results = accuracy_by_length(copier(), "copy", range(1, 41), 20, seed=0, positions_for=arange,
                                 train_lengths=(1, 10))
    assert [r.accuracy for r in results] == [1.0] * 40
    summary = summarize(results)
    assert summary["seen"] == {"accuracy": 1.0, "se": 0.0, "lengths": 10, "token_accuracy": 1.0}
    assert summary["unseen"] == {"accuracy": 1.0, "se": 0.0, "lengths": 30, "token_accuracy": 1.0}


def test_a_copier_that_fails_past_the_training_length_scores_one_seen_and_zero_unseen():
    results = accuracy_by_length(copier(max_length=10), "copy", range(1, 21), 20, seed=0, positions_for=arange,
                                 train_lengths=(1, 10))
    assert [r.seen for r in results] == [True] * 10 + [False] * 10
    summary = summarize(results)
    assert summary["seen"]["accuracy"] == 1.0 and summary["unseen"]["accuracy"] == 0.0


def test_teacher_forced_exact_match_equals_token_by_token_greedy_decoding():
    model = copier(broken_symbol="c")
    examples = evaluation_examples("copy", 6, 60, seed=1)
    fast = exact_match(model, examples, arange)
    slow = [greedy_decode(model, e.ids()[:e.answer_start], 20, arange) == e.ids()[e.answer_start:]
            for e in examples]
    assert fast == slow
    assert 0 < sum(fast) < len(fast)  # both outcomes occur: 'c' is in some inputs, not all


def test_positions_are_requested_for_each_examples_number_of_inputs():
    asked = []
    examples = evaluation_examples("copy", 3, 2, seed=0) + evaluation_examples("copy", 5, 2, seed=0)

    def positions_for(length):
        asked.append(length)
        return arange(length)

    exact_match(copier(), examples, positions_for)
    assert sorted(asked) == [len(examples[0].ids()) - 1, len(examples[2].ids()) - 1]


def test_summary_standard_error_is_the_binomial_se_of_the_mean_over_lengths():
    results = [LengthResult(1, 2, 4, True, 6, 8), LengthResult(2, 1, 4, True, 9, 12),
               LengthResult(3, 0, 4, False, 0, 16)]
    summary = summarize(results)
    se = math.sqrt(0.5 * 0.5 / 4 + 0.25 * 0.75 / 4) / 2
    assert summary["seen"]["accuracy"] == pytest.approx(0.375)
    assert summary["seen"]["se"] == pytest.approx(se)
    assert summary["unseen"] == {"accuracy": 0.0, "se": 0.0, "lengths": 1, "token_accuracy": 0.0}


def test_per_token_accuracy_counts_answer_tokens_right_given_the_correct_prefix():
    # The broken copier emits <eos> where it should copy 'c': every token after that is still scored
    # teacher-forced, so 'a c b' scores 3 of 4 (a, b, <eos> right; c wrong) and no exact match.
    example = Example("copy", 3, ("Copy", ":", "a", "c", "b"), ("a", "c", "b"))
    assert score(copier(broken_symbol="c"), [example], arange) == [(3, 4)]
    assert exact_match(copier(broken_symbol="c"), [example], arange) == [False]
    assert score(copier(), [example], arange) == [(4, 4)]


def test_per_token_accuracy_per_length_is_the_share_of_right_tokens_and_its_mean_is_over_lengths():
    results = accuracy_by_length(copier(max_length=2), "copy", range(1, 5), 10, seed=0, positions_for=arange,
                                 train_lengths=(1, 2))
    # Past length 2 it predicts <eos> everywhere: of the n + 1 answer tokens only the final <eos> is right.
    assert [(r.tokens_correct, r.tokens_total) for r in results] == [(20, 20), (30, 30), (10, 40), (10, 50)]
    assert [r.token_accuracy for r in results] == [1.0, 1.0, 0.25, 0.2]
    assert [r.correct for r in results] == [10, 10, 0, 0]
    assert summarize(results)["seen"]["token_accuracy"] == 1.0


def test_each_length_keeps_every_examples_right_and_total_answer_tokens_in_the_order_evaluated():
    results = accuracy_by_length(copier(max_length=2), "copy", range(2, 4), 5, seed=0, positions_for=arange,
                                 train_lengths=(1, 2))
    assert [r.example_tokens for r in results] == [((3, 3),) * 5, ((1, 4),) * 5]
    assert all(r.to_dict()["example_tokens"] == r.example_tokens for r in results)


def test_summary_without_unseen_lengths_says_none():
    assert summarize([LengthResult(1, 1, 1, True)])["unseen"] is None
