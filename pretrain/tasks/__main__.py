"""`python -m pretrain.tasks`: print or save task examples (the same ones training and evaluation use).

    python -m pretrain.tasks list
    python -m pretrain.tasks generate --task copy --length 5 --count 3            # one length (eval stream)
    python -m pretrain.tasks generate --task sort --min-length 2 --max-length 8 --count 10 --format jsonl
"""

from __future__ import annotations

import argparse
import json
import sys

from .generators import TASKS, example_at
from .source import evaluation_examples


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pretrain.tasks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="the tasks, their smallest length and source")
    generate = commands.add_parser("generate", help="print examples")
    generate.add_argument("--task", required=True)
    generate.add_argument("--length", type=int, help="exactly this length (the evaluation stream)")
    generate.add_argument("--min-length", type=int, help="with --max-length: lengths ~ U{min..max} (training stream)")
    generate.add_argument("--max-length", type=int)
    generate.add_argument("--count", type=int, default=5)
    generate.add_argument("--seed", type=int, default=0)
    generate.add_argument("--format", choices=("text", "jsonl"), default="text")
    return parser


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code (2 on bad input, with one line saying why)."""
    args = _parser().parse_args(argv)
    if args.command == "list":
        for name, task in TASKS.items():
            print(f"{name:<18} min length {task.min_length}  ({task.source})")
        return 0
    if args.task not in TASKS:
        return _fail(f"--task {args.task!r} is not a task; choose one of {', '.join(TASKS)}")
    minimum = TASKS[args.task].min_length
    if args.count < 1:
        return _fail(f"--count must be >= 1 (got {args.count})")
    if args.length is not None:
        if args.length < minimum:
            return _fail(f"--length must be >= {minimum} for {args.task} (got {args.length})")
        examples = evaluation_examples(args.task, args.length, args.count, args.seed)
    elif args.min_length is not None and args.max_length is not None:
        if not minimum <= args.min_length <= args.max_length:
            return _fail(f"need {minimum} <= --min-length <= --max-length for {args.task} "
                         f"(got {args.min_length}, {args.max_length})")
        examples = [example_at(args.task, args.seed, "train", i, args.min_length, args.max_length)
                    for i in range(args.count)]
    else:
        return _fail("give --length N, or --min-length A --max-length B")
    for example in examples:
        if args.format == "jsonl":
            print(json.dumps({"task": example.task, "length": example.length, "prompt": " ".join(example.prompt),
                              "answer": " ".join(example.answer), "ids": example.ids(),
                              "answer_start": example.answer_start}))
        else:
            print(f"[{example.length}] {example.text()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
