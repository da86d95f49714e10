"""Algorithmic length-generalisation tasks: generators, training samples, greedy exact-match evaluation.

`python -m pretrain.tasks generate --task copy --length 5 --count 3` prints examples.
"""

from .evaluate import LengthResult, accuracy_by_length, exact_match, greedy_decode, summarize
from .generators import TASKS, VOCAB, VOCAB_SIZE, Example, example_at, generate, get_task
from .source import TaskSource, evaluation_examples, pack, sequence_tokens

__all__ = [
    "TASKS", "VOCAB", "VOCAB_SIZE", "Example", "LengthResult", "TaskSource", "accuracy_by_length",
    "evaluation_examples", "exact_match", "example_at", "generate", "get_task", "greedy_decode", "pack",
    "sequence_tokens", "summarize",
]
