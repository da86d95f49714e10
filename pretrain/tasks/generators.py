"""Algorithmic length-generalisation tasks as data: one small vocabulary, the papers' formats.

Every example is `<bos> prompt <sep> answer <eos>`; the loss covers the answer and `<eos>`.
Formats follow the examples the papers print (RFS Table 4 for copy, copy2, reverse, addition,
sort, summation; Delétang et al. / Ruoss et al. for duplicate string and missing duplicate),
with word tokens kept as tokens ("The answer is" is three answer tokens, as in RFS).

A task's *length* n is the problem size the papers plot on the x axis:

| task | n counts | example (n) |
|---|---|---|
| copy, copy2, reverse | symbols | `Copy : c a f` → `c a f` (3) |
| addition | digits of both operands | `Compute 3 5 + 6 2 7 ?` → `The answer is 6 6 2 .` (5) |
| sort | list items (1–4 digits each) | `Sort the following list [ 9 8 , 5 ] .` → `The sorted list is [ 5 , 9 8 ] .` (2) |
| summation | terms; answer = last digit of the sum | `Compute : 3 + 9 + 2 .` → `The answer is 4 .` (3) |
| duplicate | binary symbols | `0 1 1` → `0 1 1 0 1 1` (3) |
| missing_duplicate | symbols of w in ww (one hidden as `_`) | `0 _ 0 1` → `1` (2) |

Examples are pure functions of (task, n, random.Random): `example_at` keys the generator on
(task, seed, split, index) so any sample can be rebuilt from its index alone.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

SPECIALS = ("<pad>", "<bos>", "<sep>", "<eos>")
DIGITS = tuple("0123456789")
SYMBOLS = tuple("abcdefghijklmnop")  # 16 symbols for copy / reverse (the probe's alphabet size)
WORDS = ("Copy", ":", "Compute", "+", "?", "The", "answer", "is", ".", "Sort", "the", "following",
         "list", "sorted", "[", "]", ",", "_")
VOCAB: tuple[str, ...] = SPECIALS + DIGITS + SYMBOLS + WORDS
TOKEN_ID: dict[str, int] = {token: i for i, token in enumerate(VOCAB)}
PAD, BOS, SEP, EOS = (TOKEN_ID[t] for t in SPECIALS)
VOCAB_SIZE = len(VOCAB)
MAX_SORT_DIGITS = 4


@dataclass(frozen=True)
class Example:
    """One task instance: prompt and answer as token strings, and its length n."""

    task: str
    length: int
    prompt: tuple[str, ...]
    answer: tuple[str, ...]

    def ids(self) -> list[int]:
        """Token ids of `<bos> prompt <sep> answer <eos>`."""
        return [BOS, *(TOKEN_ID[t] for t in self.prompt), SEP, *(TOKEN_ID[t] for t in self.answer), EOS]

    @property
    def answer_start(self) -> int:
        """Index in `ids()` of the first answer token (the one after `<sep>`)."""
        return len(self.prompt) + 2

    def text(self) -> str:
        """Human-readable `prompt → answer`."""
        return f"{' '.join(self.prompt)} → {' '.join(self.answer)}"


def _digits(value: int) -> list[str]:
    return list(str(value))


def _number(num_digits: int, rng: random.Random) -> int:
    """A number with exactly `num_digits` digits (no leading zero unless it is 0 itself)."""
    if num_digits == 1:
        return rng.randrange(10)
    return rng.randrange(10 ** (num_digits - 1), 10 ** num_digits)


def _copy(n: int, rng: random.Random):
    x = [rng.choice(SYMBOLS) for _ in range(n)]
    return ["Copy", ":", *x], x


def _copy2(n: int, rng: random.Random):
    x = [rng.choice(SYMBOLS)] * n
    return ["Copy", ":", *x], x


def _reverse(n: int, rng: random.Random):
    x = [rng.choice(SYMBOLS) for _ in range(n)]
    return x, x[::-1]


def _addition(n: int, rng: random.Random):
    left_digits = rng.randint(1, n - 1)
    a, b = _number(left_digits, rng), _number(n - left_digits, rng)
    return ["Compute", *_digits(a), "+", *_digits(b), "?"], ["The", "answer", "is", *_digits(a + b), "."]


def _list_tokens(numbers: list[int]) -> list[str]:
    tokens = ["["]
    for i, number in enumerate(numbers):
        tokens += ([","] if i else []) + _digits(number)
    return tokens + ["]"]


def _sort(n: int, rng: random.Random):
    numbers = [_number(rng.randint(1, MAX_SORT_DIGITS), rng) for _ in range(n)]
    return (["Sort", "the", "following", "list", *_list_tokens(numbers), "."],
            ["The", "sorted", "list", "is", *_list_tokens(sorted(numbers)), "."])


def _summation(n: int, rng: random.Random):
    terms = [rng.randrange(10) for _ in range(n)]
    prompt = ["Compute", ":"]
    for i, term in enumerate(terms):
        prompt += (["+"] if i else []) + [str(term)]
    return prompt + ["."], ["The", "answer", "is", str(sum(terms) % 10), "."]


def _duplicate(n: int, rng: random.Random):
    x = [rng.choice("01") for _ in range(n)]
    return x, x + x


def _missing_duplicate(n: int, rng: random.Random):
    w = [rng.choice("01") for _ in range(n)]
    ww = w + w
    hidden = rng.randrange(2 * n)
    answer = ww[hidden]
    ww[hidden] = "_"
    return ww, [answer]


@dataclass(frozen=True)
class Task:
    """A task: its generator, smallest length, and the longest token sequence a length can give."""

    name: str
    make: Callable[[int, random.Random], tuple[list[str], list[str]]]
    min_length: int
    # Upper bound on len(Example.ids()) at length n (used to size seq_length).
    max_tokens: Callable[[int], int]
    source: str


TASKS: dict[str, Task] = {
    "copy": Task("copy", _copy, 1, lambda n: 2 * n + 5, "RFS Table 4 (Kazemnejad et al.)"),
    "copy2": Task("copy2", _copy2, 1, lambda n: 2 * n + 5, "RFS Table 4"),
    "reverse": Task("reverse", _reverse, 1, lambda n: 2 * n + 3, "RFS Table 4"),
    # a + b has at most max(digits) + 1 <= n digits.
    "addition": Task("addition", _addition, 2, lambda n: 2 * n + 10, "RFS Table 4"),
    "sort": Task("sort", _sort, 1, lambda n: 2 * n * (MAX_SORT_DIGITS + 1) + 15, "RFS Table 4"),
    "summation": Task("summation", _summation, 1, lambda n: 2 * n + 10, "RFS Table 4"),
    "duplicate": Task("duplicate", _duplicate, 1, lambda n: 3 * n + 3, "Ruoss et al. (Delétang et al.)"),
    "missing_duplicate": Task("missing_duplicate", _missing_duplicate, 1, lambda n: 2 * n + 4,
                              "Ruoss et al. (Delétang et al.)"),
}


def get_task(name: str) -> Task:
    """The task called `name`; ValueError naming the choices otherwise."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose one of {', '.join(TASKS)}")
    return TASKS[name]


def generate(task: str, length: int, rng: random.Random) -> Example:
    """One example of `task` at length `length`, drawn with `rng`."""
    spec = get_task(task)
    if length < spec.min_length:
        raise ValueError(f"task {task!r} needs length >= {spec.min_length} (got {length})")
    prompt, answer = spec.make(length, rng)
    return Example(task, length, tuple(prompt), tuple(answer))


def keyed_rng(task: str, seed: int, split: str, index: int) -> random.Random:
    """The generator of sample `index` of (task, seed, split): independent of every other sample."""
    # String seeds go through SHA-512 in random.seed (version 2): stable across runs and platforms.
    return random.Random(f"tasks/{task}/{seed}/{split}/{index}")


def example_at(task: str, seed: int, split: str, index: int, min_length: int, max_length: int) -> Example:
    """Sample `index` of the stream: length ~ U{min_length..max_length}, then the example."""
    rng = keyed_rng(task, seed, split, index)
    return generate(task, rng.randint(min_length, max_length), rng)


def decode(ids: list[int]) -> list[str]:
    """Token strings of `ids`."""
    return [VOCAB[i] for i in ids]
