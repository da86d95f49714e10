"""The command line of `python -m pretrain eval`, built without importing torch.

`python -m pretrain` parses with it before it imports pretrain.evaluation's heavy modules (so `--help` and a
wrong invocation answer in well under a second); eval_cli then parses the same arguments again. The choice
tables the parser offers live here and the modules that use them import them from here.
"""

from __future__ import annotations

import argparse
import os

from pretrain.cli import Parser, add_set
from pretrain.hf.arguments import ROPE_SCALING_KINDS, cli_scaling_kind

BACKENDS = ("auto", "hf", "megatron")
BACKEND_HELP = ("auto (default): hf where the checkpoint's architecture exports, else megatron (SSMax, "
                "NoPE-interleaved, NoPE, ALiBi); hf: transformers with SDPA, memory linear in L; megatron: "
                "FloatPositionGPTModel directly (same losses, tested)")
GAIN_METHODS = ("exact", "kv_cache")
MAX_BATCH_TOKENS = 16384  # default token budget of one forward pass (batch × length)
DEVICE_HELP = "torch device (default: cuda when available, else cpu)"
SUBCOMMANDS = ("run", "all", "report", "downstream")
SET_HELP = ("an inference-time model field of a Megatron checkpoint: model.rope_kernel (auto|unfused|triton) or "
            "model.core_attention (sdpa|megatron); fields that change what the weights mean are refused")


def eval_argv(argv: list[str] | None) -> list[str] | None:
    """`eval MODEL --data ...` means `eval run MODEL ...` (MODEL an existing path); a bare `eval reprot` is refused."""
    if argv and argv[0] not in SUBCOMMANDS and not argv[0].startswith("-") \
            and (os.sep in argv[0] or os.path.exists(argv[0])):
        return ["run", *argv]
    return argv


def default_device(args: argparse.Namespace) -> argparse.Namespace:
    """`--device` left out: cuda when available, else cpu (resolved after parsing: torch is imported here)."""
    if getattr(args, "device", "") is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    return args


def parse_tasks(text: str) -> list[str]:
    """Comma-separated lm-eval task names -> list (order kept, duplicates dropped)."""
    tasks = list(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    if not tasks:
        raise argparse.ArgumentTypeError("--tasks is empty: name lm-eval tasks, e.g. --tasks hellaswag,arc_easy")
    return tasks


class EvalParser(Parser):
    """A Parser that reads `eval MODEL ...` as `eval run MODEL ...`."""

    def parse_args(self, args=None, namespace=None):
        """As Parser's, after eval_argv."""
        return super().parse_args(eval_argv(list(args) if args is not None else None), namespace)


def _ints(text: str) -> list[int]:
    try:
        return [int(float(v)) for v in text.replace(" ", "").split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def eval_parser() -> Parser:
    """The parser of `python -m pretrain eval` (subcommands run, all, report, downstream)."""
    parser = EvalParser(prog="python -m pretrain eval",
                        description="Evaluate RoPE position strategies (PosAug paper §3).")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="evaluate one model; writes a JSON record")
    run.add_argument("model", help="Megatron run dir / iter_* dir from `pretrain train`, or an HF model dir")
    run.add_argument("--data", required=True,
                     help="data_prep output prefix (its validation split), a .bin/.idx prefix, or a .txt/.jsonl file")
    run.add_argument("--tokenizer", help="tokenizer for text data and passkey (default: the data's/model's)")
    run.add_argument("--text-key", default="text", help="JSONL field holding the text (default: text)")
    run.add_argument("--lengths", type=_ints, default=[], help="L_eval values, e.g. 2048,8192,16384")
    run.add_argument("--num-spans", type=int, default=20, help="spans per length (paper: 20)")
    run.add_argument("--backend", choices=BACKENDS, default="auto", help=BACKEND_HELP)
    run.add_argument("--train-window", type=int, help="training window w (required for HF dirs)")
    run.add_argument("--rope-scaling", choices=ROPE_SCALING_KINDS,
                     help="inference-time RoPE transform on top of the run's evaluation positions")
    run.add_argument("--factor", type=float, help="rope scaling factor (default: L_eval / w)")
    run.add_argument("--batch-size", type=int, help="spans per forward pass (default: from --max-batch-tokens)")
    run.add_argument("--max-batch-tokens", type=int, default=MAX_BATCH_TOKENS, help="token budget per forward pass")
    run.add_argument("--in-start", type=int, help="first in-distribution target of the cliff (default: min(64, w/4), "
                     "the same range every tool uses: pretrain/evaluation/ranges.py)")
    run.add_argument("--context-gain", type=_ints, default=[], help="contexts C for G(C), e.g. 1024,2048,4096")
    run.add_argument("--gain-window", type=int, help="sliding window of G(C) (default: the paper's 512, or w/4 "
                     "below its w = 2048)")
    run.add_argument("--gain-method", choices=GAIN_METHODS, default="exact",
                     help="exact: each target sees exactly the previous window tokens; kv_cache: the "
                          "paper's truncated KV cache with RoPE offset reset (hf backend)")
    run.add_argument("--kv-chunk", type=int, help="tokens per step of the kv_cache method (default: window)")
    run.add_argument("--passkey-lengths", type=_ints, default=[], help="prompt lengths for passkey retrieval")
    run.add_argument("--passkey-n", type=int, default=100, help="passkey examples per length (paper: 100)")
    run.add_argument("--ruler-lengths", type=_ints, default=[], help="prompt lengths for RULER single needle")
    run.add_argument("--ruler-n", type=int, default=50, help="RULER examples per length (paper: 50)")
    run.add_argument("--entropy-spans", type=int, default=0,
                     help="spans (at the largest L) for the attention entropy ratio; 0 = skip")
    run.add_argument("--name", help="run name in the record (default: the config's name / directory name)")
    run.add_argument("--label", help="group label for tables (default: name without a seed suffix)")
    run.add_argument("--seed", type=int, default=0, help="seed of passkey/RULER example generation")
    run.add_argument("--allow-tokenizer-mismatch", action="store_true",
                     help="evaluate even if the data's tokenizer differs from the run's")
    run.add_argument("--device", help=DEVICE_HELP)
    run.add_argument("--output", dest="out", default="eval_results", help="directory for the JSON record")
    run.add_deprecated("--out", "out", "--output")
    run.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_set(run, dest="overrides", help=SET_HELP)

    every = sub.add_parser("all", help="evaluate every finished run under a directory not evaluated yet")
    every.add_argument("directory", help="directory of run directories (e.g. a grid of sizes × methods × seeds)")
    every.add_argument("--lengths", type=_ints, default=None, help="L_eval values (default: 8 × each run's window)")
    every.add_argument("--data", help="evaluation data for every run (default: each run's data.data_path)")
    every.add_argument("--num-spans", type=int, default=20, help="spans per length (paper: 20)")
    every.add_argument("--context-gain", type=_ints, default=[], help="contexts C for G(C), e.g. 1024,2048,4096")
    every.add_argument("--gain-window", type=int, help="sliding window of G(C) (default: the paper's 512, or w/4 "
                       "below its w = 2048)")
    every.add_argument("--gain-method", choices=GAIN_METHODS, default="exact")
    every.add_argument("--backend", choices=BACKENDS, default="auto", help=BACKEND_HELP)
    every.add_argument("--max-batch-tokens", type=int, default=MAX_BATCH_TOKENS,
                       help="token budget per forward pass")
    every.add_argument("--device", help=DEVICE_HELP)
    every.add_argument("--output", dest="out", help="directory for the JSON records (default: DIRECTORY/eval_records)")
    every.add_deprecated("--out", "out", "--output")
    every.add_argument("--no-progress", action="store_true", help="no progress lines")
    every.add_argument("--downstream", type=parse_tasks,
                       help="also lm-eval tasks for every finished run, e.g. hellaswag,arc_easy (see eval downstream)")
    every.add_argument("--num-fewshot", type=int, help="--downstream: few-shot examples (default: the task's)")
    every.add_argument("--limit", type=float, help="--downstream: examples per task (testing only)")
    every.add_argument("--include-path", help="--downstream: directory of your own lm-eval task YAML files")
    add_set(every, dest="overrides", help=SET_HELP + " (every run)")

    rep = sub.add_parser("report", help="aggregate records: CSV + Markdown tables and PNG plots")
    rep.add_argument("records", nargs="+", help="record JSON files or directories of them")
    rep.add_argument("--output", dest="out", default="eval_report", help="output directory")
    rep.add_deprecated("--out", "out", "--output")
    rep.add_argument("--baseline", help="method or label of the baseline; every size is compared with its own "
                     "(default: 'baseline' when such runs exist)")
    rep.add_argument("--length", type=int, help="L_eval for the loss-curve and cliff-vs-size plots (default: largest)")
    _add_downstream(sub)
    return parser



def _batch_size(text: str) -> int | str:
    if text == "auto" or (text.isdigit() and int(text) > 0):
        return text if text == "auto" else int(text)
    raise argparse.ArgumentTypeError(f"expected a positive integer or 'auto', got {text!r}")


def _add_downstream(sub) -> None:
    """The `eval downstream` subcommand's arguments."""
    p = sub.add_parser("downstream", help="lm-evaluation-harness tasks (HellaSwag, ARC, ...) on a run or HF model")
    p.add_argument("model", help="Megatron run dir / iter_* dir (exported to HF in a temporary directory), "
                   "or an HF causal LM directory")
    p.add_argument("--tasks", type=parse_tasks, required=True, help="lm-eval task names, e.g. hellaswag,arc_easy")
    p.add_argument("--num-fewshot", type=int, help="few-shot examples per prompt (default: the task's, else 0)")
    p.add_argument("--limit", type=float, help="examples per task (testing only; < 1 = a fraction)")
    p.add_argument("--context-length", type=int,
                   help="lm-eval's max_length (longer inputs are cut from the left; default: the model's "
                        "max_position_embeddings = the context the method serves for our exports); also the length "
                        "an RFS model's positions and the default --factor are set for")
    p.add_argument("--rope-scaling", type=cli_scaling_kind, choices=ROPE_SCALING_KINDS,
                   help="inference-time RoPE transform (PosAug-trained models need none)")
    p.add_argument("--factor", type=float, help="rope scaling factor (default: --context-length / window)")
    p.add_argument("--include-path", help="directory (or file) of your own lm-eval task YAML files")
    p.add_argument("--tokenizer", help="tokenizer of a Megatron checkpoint (default: its data manifest's)")
    p.add_argument("--train-window", type=int,
                   help="HF directories with --rope-scaling: the training window (default: our exports' recorded "
                        "window, else max_position_embeddings)")
    p.add_argument("--batch-size", type=_batch_size, default=8, help="lm-eval batch size, or 'auto' (default 8)")
    p.add_argument("--device", help=DEVICE_HELP)
    p.add_argument("--output", dest="out", help="directory for lm-eval's results JSON (default: <run dir>/downstream)")
    p.add_deprecated("--out", "out", "--output")
