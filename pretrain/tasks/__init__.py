"""Algorithmic length-generalisation tasks: generators, training samples, greedy exact-match evaluation.

`python -m pretrain.tasks generate --task copy --length 5 --count 3` prints examples.
Importing this package registers the task data behind `data.task` with the trainer and imports no torch
(`python -m pretrain` imports it before every command, `--help` included); the names below load on first use.
"""

from pretrain.trainer.task_data import TaskDataSource, register_task_source

from .generators import EOS

# name -> the submodule that defines it
_EXPORTS = {
    **dict.fromkeys(("LengthResult", "accuracy_by_length", "exact_match", "greedy_decode", "summarize"), "evaluate"),
    **dict.fromkeys(("TASKS", "VOCAB", "VOCAB_SIZE", "Example", "example_at", "generate", "get_task"), "generators"),
    **dict.fromkeys(("TaskSource", "evaluation_examples", "pack", "sequence_tokens"), "source"),
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    """A public name of the package, imported from its submodule on first use."""
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _check(data, model) -> None:
    from .source import check_task_config

    check_task_config(data, model)


def _datasets(data, seq_length: int, seed: int):
    from .source import task_datasets

    return task_datasets(data, seq_length, seed)


register_task_source(TaskDataSource(check=_check, datasets=_datasets, eod=EOS))  # the trainer's data.task
