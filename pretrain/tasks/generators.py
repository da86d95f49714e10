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


# Each task is a sampler of prompts (length n, rng) and a solver prompt -> answer; the solver
# is what tests check against the papers' printed examples.

def _symbols(n: int, rng: random.Random, alphabet=SYMBOLS) -> list[str]:
    return [rng.choice(alphabet) for _ in range(n)]


def _sample_copy(n: int, rng: random.Random) -> list[str]:
    return ["Copy", ":", *_symbols(n, rng)]


def _sample_copy2(n: int, rng: random.Random) -> list[str]:
    return ["Copy", ":", *[rng.choice(SYMBOLS)] * n]


def _solve_copy(prompt: list[str]) -> list[str]:
    return list(prompt[2:])


def _sample_addition(n: int, rng: random.Random) -> list[str]:
    left_digits = rng.randint(1, n - 1)
    a, b = _number(left_digits, rng), _number(n - left_digits, rng)
    return ["Compute", *_digits(a), "+", *_digits(b), "?"]


def _solve_addition(prompt: list[str]) -> list[str]:
    a, b = "".join(prompt[1:-1]).split("+")
    return ["The", "answer", "is", *_digits(int(a) + int(b)), "."]


def _list_tokens(numbers: list[int]) -> list[str]:
    tokens = ["["]
    for i, number in enumerate(numbers):
        tokens += ([","] if i else []) + _digits(number)
    return tokens + ["]"]


def _sample_sort(n: int, rng: random.Random) -> list[str]:
    numbers = [_number(rng.randint(1, MAX_SORT_DIGITS), rng) for _ in range(n)]
    return ["Sort", "the", "following", "list", *_list_tokens(numbers), "."]


def _solve_sort(prompt: list[str]) -> list[str]:
    numbers = [int(item) for item in "".join(prompt[5:-2]).split(",")]
    return ["The", "sorted", "list", "is", *_list_tokens(sorted(numbers)), "."]


def _sample_summation(n: int, rng: random.Random) -> list[str]:
    prompt = ["Compute", ":"]
    for i in range(n):
        prompt += (["+"] if i else []) + [str(rng.randrange(10))]
    return prompt + ["."]


def _solve_summation(prompt: list[str]) -> list[str]:
    total = sum(int(t) for t in prompt[2:-1] if t != "+")
    return ["The", "answer", "is", str(total % 10), "."]


def _sample_missing_duplicate(n: int, rng: random.Random) -> list[str]:
    ww = _symbols(n, rng, "01") * 2
    ww[rng.randrange(2 * n)] = "_"
    return ww


def _solve_missing_duplicate(prompt: list[str]) -> list[str]:
    n, hidden = len(prompt) // 2, prompt.index("_")
    return [prompt[(hidden + n) % (2 * n)]]


@dataclass(frozen=True)
class Task:
    """A task: its generator, smallest length, and the longest token sequence a length can give."""

    name: str
    sample: Callable[[int, random.Random], list[str]]  # (n, rng) -> prompt
    solve: Callable[[list[str]], list[str]]  # prompt -> answer
    min_length: int
    # Upper bound on len(Example.ids()) at length n (used to size seq_length).
    max_tokens: Callable[[int], int]
    source: str


TASKS: dict[str, Task] = {
    "copy": Task("copy", _sample_copy, _solve_copy, 1, lambda n: 2 * n + 5, "RFS Table 4 (Kazemnejad et al.)"),
    "copy2": Task("copy2", _sample_copy2, _solve_copy, 1, lambda n: 2 * n + 5, "RFS Table 4"),
    "reverse": Task("reverse", _symbols, lambda p: p[::-1], 1, lambda n: 2 * n + 3, "RFS Table 4"),
    # a + b has at most max(digits) + 1 <= n digits.
    "addition": Task("addition", _sample_addition, _solve_addition, 2, lambda n: 2 * n + 10, "RFS Table 4"),
    "sort": Task("sort", _sample_sort, _solve_sort, 1, lambda n: 2 * n * (MAX_SORT_DIGITS + 1) + 15,
                 "RFS Table 4"),
    "summation": Task("summation", _sample_summation, _solve_summation, 1, lambda n: 2 * n + 10, "RFS Table 4"),
    "duplicate": Task("duplicate", lambda n, rng: _symbols(n, rng, "01"), lambda p: p + p, 1,
                      lambda n: 3 * n + 3, "Ruoss et al. (Delétang et al.)"),
    "missing_duplicate": Task("missing_duplicate", _sample_missing_duplicate, _solve_missing_duplicate, 1,
                              lambda n: 2 * n + 4, "Ruoss et al. (Delétang et al.)"),
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
    prompt = spec.sample(length, rng)
    return Example(task, length, tuple(prompt), tuple(spec.solve(list(prompt))))


def solve(task: str, prompt: str) -> str:
    """The answer to a space-separated prompt, e.g. solve('summation', 'Compute : 3 + 9 .') == 'The answer is 2 .'."""
    return " ".join(get_task(task).solve(prompt.split()))


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
