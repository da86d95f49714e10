"""`python -m pretrain reproduce`: one dispatcher for every suite, on this machine or (`--slurm`) as SLURM jobs.

A suite registers here with one row of SUITES: its name, the module and function that take the rest of the
command line (`--suite NAME` removed), and a one-line help. The function parses its own options with a
`pretrain.cli.Parser` (prog `python -m pretrain reproduce --suite NAME`) and returns the exit code.
`--slurm` submits the `lm` suite's grid through pretrain.experiments.slurm_grid. Nothing here imports torch.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from pretrain.cli import Parser, add_seeds, add_set, existing_input, seeds_of, unknown_choice


@dataclass(frozen=True)
class Suite:
    """One reproduce suite: where its CLI lives and what it reproduces."""

    module: str
    function: str
    help: str
    slurm: bool = False  # `--slurm` can submit this suite's grid
    parser: tuple[str, str] | None = None  # (module, function) of its parser without torch: parsed before the import


SUITES = {
    "lm": Suite("pretrain.experiments.reproduce_cli", "lm_main", "language modelling: per-position loss, cliff, "
                "penalty, G(C) per method (the paper's Tables 2-4 at CPU scale)", slurm=True),
    "tasks": Suite("pretrain.tasks.suite", "main", "the algorithmic length-generalisation tasks",
                   parser=("pretrain.tasks.arguments", "tasks_parser")),
    "ablations": Suite("pretrain.experiments.ablations", "main", "the paper's ablation tables 5-11 at CPU scale",
                       parser=("pretrain.experiments.reproduce_cli", "ablations_parser")),
    "documents": Suite("pretrain.experiments.document_masking", "main",
                       "baseline, PosAug and RFS with and without document masking (cliff, penalty, paired SEs)"),
}
DEFAULT_SUITE = "lm"


def add_mode_flags(parser: Parser) -> None:
    """`--suite` and `--slurm`, shown in every suite's help (the dispatcher reads them first)."""
    lines = "; ".join(f"{name}: {suite.help}" for name, suite in SUITES.items())
    parser.add_argument("--suite", choices=list(SUITES), default=DEFAULT_SUITE, help=lines)
    parser.add_argument("--slurm", action="store_true",
                        help="submit the grid as SLURM jobs instead (`reproduce --slurm --help` for its options)")


def lm_parser() -> Parser:
    """`reproduce --suite lm`'s arguments."""
    from pretrain.experiments.presets import PRESETS, TRAINING_METHODS

    p = Parser(prog="python -m pretrain reproduce",
               description="the paper's comparison at CPU scale, from corpus to report (resumable): data_prep -> "
                           "one training run per (method, seed) -> evaluation at 8x the window -> report.md")
    add_mode_flags(p)
    p.add_argument("--output", default="reproduce_out", help="working and report directory (resumable)")
    p.add_argument("--input", dest="corpus", default=None, type=existing_input,
                   help="a JSONL/text corpus instead of the embedded one")
    p.add_deprecated("--corpus", "corpus", "--input")
    p.add_argument("--preset", default="cpu-small", choices=sorted(PRESETS), help="scale of the runs")
    add_seeds(p)
    p.add_argument("--methods", nargs="+", default=None,
                   help=f"subset of {', '.join(TRAINING_METHODS)} (the baseline is always kept; default: all)")
    add_set(p, help="config override for every training run")
    return p


def _tables(text: str) -> list[int]:
    """argparse `type` of `--tables`: comma-separated ablation table numbers."""
    from pretrain.experiments.ablation_tables import TABLES

    try:
        numbers = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        numbers = []
    if not numbers or any(n not in TABLES for n in numbers):
        raise argparse.ArgumentTypeError(f"--tables {text!r}: give comma-separated table numbers from "
                                         f"{sorted(TABLES)}, e.g. --tables 6,7")
    return sorted(set(numbers))


def ablations_parser() -> Parser:
    """`reproduce --suite ablations`'s arguments."""
    from pretrain.experiments.ablation_tables import PRESETS, TABLES

    parser = Parser(prog="python -m pretrain reproduce --suite ablations",
                    description="`python -m pretrain reproduce --suite ablations`: the paper's ablation Tables 5–11 "
                                "at CPU scale.")
    parser.add_argument("--output", default="ablations_out", help="working and report directory (resumable)")
    parser.add_argument("--preset", default="cpu-small", choices=sorted(PRESETS))
    parser.add_argument("--tables", type=_tables, default=sorted(TABLES), help="e.g. 5,6,11 (default: all, 5–11)")
    add_seeds(parser)
    parser.add_argument("--input", dest="corpus", default=None, type=existing_input,
                   help="a JSONL/text corpus instead of the embedded one")
    parser.add_deprecated("--corpus", "corpus", "--input")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="runs trained side by side, each with cores/jobs threads (default: cores)")
    parser.add_argument("--report-only", action="store_true",
                        help="write the report of the runs already evaluated under --output; train nothing")
    return parser


def lm_main(argv: list[str]) -> int:
    """CLI of `reproduce --suite lm` (the default suite)."""
    args = lm_parser().parse_args(argv)
    from pretrain.faults import OutputError
    from pretrain.experiments.presets import PRESETS
    from pretrain.experiments.reproduce import TrainingFailed, reproduce, with_methods

    try:
        seeds = seeds_of(args)
        preset = with_methods(PRESETS[args.preset], args.methods)
        reproduce(Path(args.output), preset, seeds, args.corpus, preset_name=args.preset, overrides=args.set)
    except (ValueError, FileNotFoundError, OutputError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except TrainingFailed as error:
        # Not bad input: the trainer's exit code (e.g. the hang code) is what a wrapper script acts on.
        print(f"error: {error}", file=sys.stderr)
        return error.exit_code
    return 0


def _pop_suite(argv: list[str]) -> tuple[str | None, list[str]]:
    """(the --suite value or None, argv without it); `--suite=x` and `--suite x` both."""
    rest, suite, i = [], None, 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--suite" and i + 1 < len(argv):
            suite, i = argv[i + 1], i + 2
            continue
        if arg.startswith("--suite="):
            suite = arg.split("=", 1)[1]
        else:
            rest.append(arg)
        i += 1
    return suite, rest


def main(argv: list[str]) -> int:
    """Dispatch `python -m pretrain reproduce` to its suite, or to the SLURM grid with `--slurm`."""
    import importlib

    suite, rest = _pop_suite(list(argv))
    if suite is not None and suite not in SUITES:
        print(f"usage: python -m pretrain reproduce [--suite {{{','.join(SUITES)}}}] [--slurm] ...\n"
              f"error: {unknown_choice('suite', suite, list(SUITES))}", file=sys.stderr)
        return 2
    name = suite or DEFAULT_SUITE
    if "--slurm" in rest or any(a == "--slurm-stage" or a.startswith("--slurm-stage=") for a in rest):
        if not SUITES[name].slurm:
            slurm_suites = [n for n, s in SUITES.items() if s.slurm]
            print(f"error: --slurm submits the grid of suite {', '.join(slurm_suites)}, not --suite {name}: "
                  f"run --suite {name} without --slurm (or inside one sbatch job)", file=sys.stderr)
            return 2
        from pretrain.experiments.slurm_grid import main as grid_main

        return grid_main(rest)
    chosen = SUITES[name]
    if chosen.parser:  # --help and a wrong invocation answer before the suite's module (and torch) is imported
        getattr(importlib.import_module(chosen.parser[0]), chosen.parser[1])().parse_args(rest)
    return getattr(importlib.import_module(chosen.module), chosen.function)(rest)
