"""Task samples in the trainer's data contract: `__len__` + `__getitem__(index) -> dict` of tensors.

Sample `index` is a pure function of (task, seed, split, index), so the trainer's step-keyed
sample order (step i reads samples i·G …) gives fresh examples every step with no epoch and
no loader state, and a resumed run sees exactly the samples it would have seen.
"""

from __future__ import annotations

import torch

from .generators import PAD, Example, example_at, get_task, keyed_rng, generate

# Large enough that no run wraps around (the trainer indexes modulo len()).
STREAM_SIZE = 2 ** 62


def sequence_tokens(task: str, max_length: int) -> int:
    """Model inputs needed for any example up to `max_length`: the seq_length to train with."""
    return get_task(task).max_tokens(max_length) - 1


def pack(example: Example, seq_length: int) -> dict[str, torch.Tensor]:
    """tokens / labels / loss_mask of one example, right-padded to `seq_length` (loss on the answer only),
    and position_length: its number of inputs, so the position sampler draws for the example's length."""
    ids = example.ids()
    if len(ids) - 1 > seq_length:
        raise ValueError(f"a {example.task} example of length {example.length} needs seq_length >= "
                         f"{len(ids) - 1} (got {seq_length}); raise model.seq_length")
    tokens = torch.full((seq_length,), PAD, dtype=torch.long)
    labels = torch.full((seq_length,), PAD, dtype=torch.long)
    loss_mask = torch.zeros(seq_length, dtype=torch.float32)
    tokens[: len(ids) - 1] = torch.tensor(ids[:-1])
    labels[: len(ids) - 1] = torch.tensor(ids[1:])
    # Input i predicts ids[i + 1]: the answer and <eos> are predicted from inputs answer_start - 1 ...
    loss_mask[example.answer_start - 1: len(ids) - 1] = 1.0
    return {"tokens": tokens, "labels": labels, "loss_mask": loss_mask,
            "position_length": torch.tensor(len(ids) - 1, dtype=torch.long)}


class TaskSource:
    """An endless stream of (task, seed, split) examples with lengths ~ U{min_length..max_length}."""

    def __init__(self, task: str, min_length: int, max_length: int, seq_length: int, seed: int,
                 split: str = "train", size: int = STREAM_SIZE) -> None:
        spec = get_task(task)
        if not spec.min_length <= min_length <= max_length:
            raise ValueError(f"task lengths must satisfy {spec.min_length} <= min_length <= max_length "
                             f"for {task!r} (got {min_length}, {max_length})")
        needed = sequence_tokens(task, max_length)
        if seq_length < needed:
            raise ValueError(f"{task} up to length {max_length} needs model.seq_length >= {needed} "
                             f"(got {seq_length})")
        self.task, self.min_length, self.max_length = task, min_length, max_length
        self.seq_length, self.seed, self.split, self.size = seq_length, seed, split, size

    def __len__(self) -> int:
        return self.size

    def example(self, index: int) -> Example:
        """The example behind sample `index`."""
        return example_at(self.task, self.seed, self.split, index, self.min_length, self.max_length)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return pack(self.example(index), self.seq_length)


def evaluation_examples(task: str, length: int, count: int, seed: int) -> list[Example]:
    """`count` examples at exactly `length`, from the 'eval/<length>' stream (disjoint keys from training)."""
    return [generate(task, length, keyed_rng(task, seed, f"eval/{length}", i)) for i in range(count)]


def check_task_config(data, model) -> None:
    """ValueError naming the field and the fix when data.task cannot train with this model."""
    from .generators import TASKS, VOCAB_SIZE

    if data.task not in TASKS:
        raise ValueError(f"data.task={data.task!r} is not a task; choose one of {', '.join(TASKS)}")
    minimum = TASKS[data.task].min_length
    if not minimum <= data.task_min_length <= data.task_max_length:
        raise ValueError(f"data.task_min_length / data.task_max_length must satisfy {minimum} <= min <= max "
                         f"for {data.task} (got {data.task_min_length}, {data.task_max_length})")
    if model.vocab_size < VOCAB_SIZE:
        raise ValueError(f"data.task needs model.vocab_size >= {VOCAB_SIZE} (got {model.vocab_size})")
    needed = sequence_tokens(data.task, data.task_max_length)
    if model.seq_length < needed:
        raise ValueError(f"data.task={data.task} up to length {data.task_max_length} needs model.seq_length >= "
                         f"{needed} (got {model.seq_length})")


def task_datasets(data, seq_length: int, seed: int) -> tuple[TaskSource, TaskSource]:
    """Training stream and a held-out validation stream (other keys, same lengths) of data.task."""
    def stream(split: str) -> TaskSource:
        return TaskSource(data.task, data.task_min_length, data.task_max_length, seq_length, seed, split=split)

    return stream("train"), stream("valid")

