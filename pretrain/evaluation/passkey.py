"""Passkey retrieval and RULER-style single-needle retrieval (greedy decoding, exact match).

Examples are a pure function of (seed, length, index), so every model sees the same prompts.
A prompt is built in token space: filler is repeated until the prompt is `length` tokens,
and the needle is inserted at a sentence boundary at the drawn depth.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

import torch

from .scorers import Scorer

PASSKEY_INTRO = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
                 "I will quiz you about the important information there.")
PASSKEY_FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
PASSKEY_NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key."
PASSKEY_QUESTION = "What is the pass key? The pass key is"

RULER_INTRO = ("Some special magic numbers are hidden within the following text. Make sure to memorize it. "
               "I will quiz you about the numbers afterwards.")
RULER_NEEDLE = "One of the special magic numbers for {key} is: {value}."
RULER_QUESTION = ("What is the special magic number for {key} mentioned in the provided text? "
                  "The special magic number for {key} mentioned in the provided text is")
RULER_KEYS = ("apple", "river", "silver", "forest", "candle", "marble", "harbor", "violet", "thunder", "lantern",
              "copper", "meadow", "falcon", "glacier", "orchid", "pepper", "saddle", "tunnel", "walnut", "zephyr")


@dataclass
class RetrievalExample:
    """One prompt (token ids, exactly `length` of them) and its expected answer string."""

    prompt: list[int]
    answer: str
    depth: float  # where the needle starts, as a fraction of the filler
    task: str


def _build(tokenizer, length: int, rng: random.Random, intro: str, needle: str, question: str,
           filler: str, answer: str, task: str) -> RetrievalExample:
    head, needle_ids, tail = (tokenizer.encode(intro + " "), tokenizer.encode(" " + needle + " "),
                              tokenizer.encode(" " + question))
    sentence = tokenizer.encode(" " + filler)
    budget = length - len(head) - len(needle_ids) - len(tail)
    if budget < len(sentence):
        raise ValueError(f"length {length} is too short for a {task} prompt (needs > "
                         f"{length - budget + len(sentence)} tokens with this tokenizer)")
    body = (sentence * (budget // len(sentence) + 1))[:budget]
    depth = rng.random()
    cut = round(depth * (budget // len(sentence))) * len(sentence)  # a filler-sentence boundary
    prompt = head + body[:cut] + needle_ids + body[cut:] + tail
    return RetrievalExample(prompt=prompt, answer=answer, depth=cut / max(budget, 1), task=task)


def passkey_examples(tokenizer, length: int, n: int, seed: int = 0) -> list[RetrievalExample]:
    """n passkey prompts of `length` tokens: a random 5-digit key at a random depth in filler text."""
    rng = random.Random(f"passkey/{seed}/{length}")
    out = []
    for _ in range(n):
        key = str(rng.randint(10000, 99999))
        out.append(_build(tokenizer, length, rng, PASSKEY_INTRO, PASSKEY_NEEDLE.format(key=key),
                          PASSKEY_QUESTION, PASSKEY_FILLER, key, "passkey"))
    return out


def ruler_niah_examples(tokenizer, length: int, n: int, seed: int = 0) -> list[RetrievalExample]:
    """n RULER single-needle prompts: a 7-digit magic number for a random key word in filler text."""
    rng = random.Random(f"ruler_niah/{seed}/{length}")
    out = []
    for _ in range(n):
        key, value = rng.choice(RULER_KEYS), str(rng.randint(1_000_000, 9_999_999))
        out.append(_build(tokenizer, length, rng, RULER_INTRO, RULER_NEEDLE.format(key=key, value=value),
                          RULER_QUESTION.format(key=key), PASSKEY_FILLER, value, "ruler_niah"))
    return out


def extract_answer(text: str, digits: int) -> str | None:
    """The first run of exactly `digits` digits in a generated continuation, or None."""
    match = re.search(rf"(?<!\d)\d{{{digits}}}(?!\d)", text)
    return match.group(0) if match else None


def score_answer(generated: str, answer: str) -> bool:
    """Exact match: the first number of the answer's length in the generation equals the answer."""
    return extract_answer(generated, len(answer)) == answer


@torch.no_grad()
def greedy_decode(scorer: Scorer, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Greedy continuation; every step is a full pass at the evaluation positions of the current length."""
    tokens = torch.tensor([prompt], dtype=torch.long)
    out: list[int] = []
    for _ in range(max_new_tokens):
        logits = scorer.next_token_logits(tokens, scorer.eval_positions(tokens.shape[1]))
        nxt = int(logits.argmax(-1))
        out.append(nxt)
        tokens = torch.cat([tokens, torch.tensor([[nxt]])], dim=1)
    return out


def retrieval_accuracy(scorer: Scorer, tokenizer, examples: list[RetrievalExample], *,
                       max_new_tokens: int = 10, progress: bool = False) -> dict:
    """Exact-match accuracy of greedy decoding over the examples, with per-example outputs."""
    from pretrain.console import progress as progress_line

    results = []
    for ex in progress_line(examples, desc="retrieval", enabled=progress):
        text = tokenizer.decode(greedy_decode(scorer, ex.prompt, max_new_tokens))
        results.append({"answer": ex.answer, "generated": text, "depth": ex.depth,
                        "correct": score_answer(text, ex.answer)})
    n = len(results)
    return {"accuracy": sum(r["correct"] for r in results) / n if n else float("nan"), "n": n,
            "examples": results}


def passkey(scorer: Scorer, tokenizer, length: int, n: int = 100, *, seed: int = 0,
            progress: bool = False) -> dict:
    """Passkey accuracy at `length` tokens over n examples."""
    return retrieval_accuracy(scorer, tokenizer, passkey_examples(tokenizer, length, n, seed), progress=progress)


def ruler_niah(scorer: Scorer, tokenizer, length: int, n: int = 50, *, seed: int = 0,
               progress: bool = False) -> dict:
    """RULER single-needle accuracy at `length` tokens over n examples."""
    return retrieval_accuracy(scorer, tokenizer, ruler_niah_examples(tokenizer, length, n, seed),
                              max_new_tokens=12, progress=progress)
