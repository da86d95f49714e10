"""`python -m pretrain reproduce --slurm`: a whole grid of runs as SLURM jobs, from shards to report.

One command plans every run of the grid (memory per GPU, wall clock and GPU-hours: pretrain.plan), refuses
the grid before any submission when a run cannot fit, then submits it through the existing launchers,
chained with `sbatch --dependency`, so it runs to its report without a person:

    data job (only when the shards are missing)
      └─ afterok ─▶ training: one job array per size × method (array task i = seed i of SEEDS)
                      └─ afterok:<array>_<i> ─▶ one evaluation job per run (the baseline's also scores
                                                 its inference-time PI / NTK / YaRN rows)
                                                  └─ afterany ─▶ the report job (whatever finished;
                                                                 missing runs listed)

State lives in files: run directories (checkpoints), evaluation records, and OUT/grid.json (the grid and
the job ids it submitted); `squeue` says which of those jobs are still queued or running. A rerun
therefore submits exactly what is neither finished nor in flight. Plain sbatch dependencies rather than
NeMo-Run or submitit: slurm/README.md ("A whole grid") says why.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from pretrain.faults import OutputError
from pretrain.experiments.grid_plan import (GRID_FILE, PAPER, PAPER_SEEDS, PRESETS, Spec, _log, load_state,
                                            parse_run_name, plan_grid, run_name, shards_ready)
from pretrain.experiments.grid_status import stage_data, stage_eval, stage_report, status
from pretrain.experiments.grid_submit import Slurm, submit
from pretrain.experiments.presets import TRAINING_METHODS
from pretrain.cli import Parser, add_seeds, add_set, seeds_of
from pretrain.table import SHIPPED_METHODS, TABLE1_SIZES, former_name_hint

__all__ = ["PAPER_SEEDS", "Spec", "main", "make_spec", "parse_run_name", "parser", "run_name"]

# ---- CLI --------------------------------------------------------------------------------------------------

def _split(values: list[str] | None) -> list[str]:
    return [v for item in values or [] for v in item.replace(",", " ").split()]


def data_refusal(prefix: str, corpus: str | None, tokenizer: str | None) -> str | None:
    """Why a paper grid cannot be submitted with these data arguments (one line), or None when it can."""
    if shards_ready(prefix) or (corpus and tokenizer):
        return None
    return (f"no shards at --data-prefix {prefix} (no manifest): pass --input and --tokenizer to build them in a "
            "data_prep job first, or the prefix of existing shards")


def make_spec(args: argparse.Namespace) -> Spec:
    """The grid the arguments ask for; ValueError (one line naming the flag) when they cannot make one."""
    from pretrain.plan.hardware import GPUS

    # methods_all: what --methods may name; the default grid: the paper's shipped rows, a preset's default rows.
    # A preset's grid takes every method its local `reproduce --preset` does (presets.TRAINING_METHODS).
    if args.preset == PAPER:
        sizes_all, methods_all, default, seeds = TABLE1_SIZES, SHIPPED_METHODS, SHIPPED_METHODS, list(PAPER_SEEDS)
    elif args.preset in PRESETS:
        preset = PRESETS[args.preset]
        sizes_all, methods_all, default, seeds = (preset.model,), TRAINING_METHODS, preset.methods, [42]
    else:
        raise ValueError(f"--preset {args.preset}: choose one of {[PAPER, *sorted(PRESETS)]}")
    sizes = _split(args.sizes) or list(sizes_all)
    bad = [s for s in sizes if s not in sizes_all]
    if bad:
        raise ValueError(f"--sizes {' '.join(bad)}: the {args.preset} grid has sizes {', '.join(sizes_all)}")
    methods = _split(args.methods) or list(default)
    bad = [m for m in methods if m not in methods_all]
    if bad:
        raise ValueError(f"--methods {' '.join(bad)}: the {args.preset} grid has methods {', '.join(methods_all)}"
                         f"{former_name_hint(bad)}")
    methods = ["baseline", *[m for m in methods_all if m in methods and m != "baseline"]]  # the paired reference
    seeds = seeds_of(args, flag_default=seeds)
    if args.budget and args.preset != PAPER:
        raise ValueError(f"--budget {args.budget}: budgets are of Table 1 sizes (--preset paper); CPU presets "
                         "have their own steps")
    if args.gpu not in GPUS:
        raise ValueError(f"--gpu {args.gpu}: choose one of {', '.join(sorted(GPUS))}")
    if args.nodes is not None and args.nodes < 1:
        raise ValueError(f"--nodes {args.nodes}: expected at least 1")
    if args.mfu is not None and not 0 < args.mfu <= 1:
        raise ValueError(f"--mfu {args.mfu}: expected a fraction in (0, 1], e.g. --mfu 0.3")
    out = Path(args.output).resolve()
    if args.preset == PAPER:
        if not args.data_prefix:
            raise ValueError("--preset paper needs --data-prefix: the data_prep --data-prefix of the shards "
                             "(with --input and --tokenizer when they still have to be built)")
        prefix = str(Path(args.data_prefix).resolve())
        refusal = data_refusal(prefix, args.corpus, args.tokenizer)
        if refusal and not args.dry_run:  # a dry run plans first, then refuses the same way (main)
            raise ValueError(refusal)
    else:
        if args.data_prefix or args.tokenizer:
            raise ValueError(f"--preset {args.preset} builds its own data under --output (its tokenizer too): "
                             "drop --data-prefix/--tokenizer, or use --preset paper")
        prefix = str(out / "data" / "shards" / "corpus")
    for flag, dest in (("input", "corpus"), ("tokenizer", "tokenizer")):
        path = getattr(args, dest)
        if path and not Path(path).exists():
            raise ValueError(f"--{flag} {path} does not exist: give the path of an existing "
                             f"{'corpus file or directory' if dest == 'corpus' else 'tokenizer'}")
    return Spec(preset=args.preset, out=str(out), sizes=tuple(sizes), methods=tuple(methods), seeds=tuple(seeds),
                data_prefix=prefix, gpu=args.gpu, sets=tuple(args.set), corpus=args.corpus,
                tokenizer=args.tokenizer, sbatch=tuple(shlex.split(args.sbatch or "")), mfu=args.mfu,
                nodes=args.nodes, budget=args.budget)


def parser() -> Parser:
    """`reproduce --slurm`'s arguments."""
    from pretrain.plan.hardware import DEFAULT_GPU

    p = Parser(prog="python -m pretrain reproduce --slurm",
               description="submit a whole grid of runs to SLURM: plan, train, evaluate, report")
    p.add_argument("--slurm", action="store_true", help="(this mode)")
    gpu_presets = ", ".join(sorted(name for name, preset in PRESETS.items() if preset.gpu))
    p.add_argument("--preset", default=PAPER, help=f"{PAPER} (the {len(TABLE1_SIZES)} Table 1 sizes x the "
                   f"{len(SHIPPED_METHODS)} shipped methods x {len(PAPER_SEEDS)} seeds) or a reproduce preset "
                   f"({', '.join(sorted(PRESETS))}; {gpu_presets} on GPU nodes, the others on CPU nodes)")
    p.add_argument("--output", default="reproduce_grid", help="grid directory: runs, logs, results, report.md")
    p.add_argument("--sizes", nargs="+", help="a subset of the preset's sizes")
    p.add_argument("--methods", nargs="+", help="methods of the grid (the baseline is always kept): paper, any "
                   "shipped method; a reproduce preset, any method its local `reproduce --methods` takes")
    add_seeds(p, default_count=None)  # default: 42,137,2024 for paper, 42 for CPU presets
    p.add_argument("--gpu", default=DEFAULT_GPU, help="GPU model the plan checks memory and cost against")
    p.add_argument("--mfu", type=float, help="MFU the plan assumes (default: the GPU's published one)")
    p.add_argument("--nodes", type=int, help="nodes of every training job (default: each launcher's; CPU presets 1)")
    add_set(p, help="config override for every training run")
    p.add_argument("--budget", choices=("table1", "chinchilla"), help="token budget of every run (paper preset): "
                   "table1 = the paper's Table 1 tokens, chinchilla = 20 tokens per parameter (default: table1, "
                   "the shipped configs')")
    p.add_argument("--data-prefix", help="paper: the shards' prefix, as given to data_prep build --data-prefix")
    p.add_argument("--input", dest="corpus", help="paper: corpus for the data_prep job (when the shards are missing); CPU "
                   "presets: a corpus instead of the embedded one")
    p.add_deprecated("--corpus", "corpus", "--input")
    p.add_argument("--tokenizer", help="paper: tokenizer for the data_prep job")
    p.add_argument("--sbatch", help="extra sbatch options for every job, e.g. \"--partition=gpu --account=x\"")
    p.add_argument("--dry-run", action="store_true", help="print the plan and every sbatch command; submit nothing "
                   "(also before the shards at --data-prefix exist; then it ends with the submission's refusal, "
                   "exit 2)")
    p.add_argument("--status", action="store_true", help="show the grid in --output: every run's state, job, step, "
                   "last loss, evaluation, and the report")
    p.add_argument("--slurm-stage", choices=("data", "eval", "report"), help=argparse.SUPPRESS)
    p.add_argument("--run", help=argparse.SUPPRESS)
    return p


def _stage(args: argparse.Namespace) -> int:
    out = Path(args.output).resolve()
    raw = load_state(out).get("spec")
    if raw is None:
        raise ValueError(f"no grid at {out} ({GRID_FILE} missing)")
    spec = Spec.from_json(raw)
    if args.slurm_stage == "data":
        stage_data(spec)
    elif args.slurm_stage == "eval":
        stage_eval(spec, args.run)
    else:
        _log(f"report: {stage_report(spec)}")
    return 0


def main(argv: list[str]) -> int:
    """CLI of `python -m pretrain reproduce --slurm` (and of its jobs' stages)."""
    args = parser().parse_args(argv)
    try:
        if args.slurm_stage:
            return _stage(args)
        if args.status:  # the grid as submitted (grid.json), whatever else the command line says
            out = Path(args.output).resolve()
            raw = load_state(out).get("spec")
            if raw is None:
                raise ValueError(f"no grid at {out}: run the same command without --status to submit it")
            print(status(Spec.from_json(raw), Slurm(dry_run=False).live()))
            return 0
        spec = make_spec(args)
        text, refusals = plan_grid(spec)
        print(text, flush=True)
        if refusals:
            more = f" (and {len(refusals) - 1} more run(s) of the grid)" if len(refusals) > 1 else ""
            print(f"error: the grid does not fit, nothing was submitted: {refusals[0]}{more}", file=sys.stderr)
            return 2
        commands, state = submit(spec, args.dry_run)
        if args.dry_run:
            print(f"# dry run: {len(commands)} sbatch command(s), nothing submitted\nset -e")
            print("\n".join(commands), flush=True)
            # the submission's own refusal, after the plan and commands it would have shown: exit 2 as it does
            refusal = None if spec.cpu else data_refusal(spec.data_prefix, spec.corpus, spec.tokenizer)
            if refusal:
                print(f"error: {refusal}", file=sys.stderr)
                return 2
            return 0
        if not commands:
            _log(f"nothing to submit: every run is finished and evaluated; report: {Path(spec.out) / 'report.md'}")
            return 0
        for line in commands:
            _log(f"submitted {line}")
        _log(f"{len(commands)} job(s) submitted; `--status` shows the grid; report: {Path(spec.out) / 'report.md'}")
        return 0
    except (ValueError, OutputError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except RuntimeError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
