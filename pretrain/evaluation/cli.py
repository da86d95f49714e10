"""`python -m pretrain eval run|all|report|downstream ...` and the `evaluate` API behind it."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

import torch

from pretrain.cli import Parser
from data_prep.errors import OutputError, check_writable
from data_prep.overlap import check_apart
from megatron_ext.positions import ROPE_SCALING_KINDS

from . import downstream, metrics, report
from .data import TokenStream, load_stream
from .record import evaluate
from .scorers import BACKENDS, Scorer, load_scorer

log = logging.getLogger(__name__)


def _ints(text: str) -> list[int]:
    try:
        return [int(float(v)) for v in text.replace(" ", "").split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _parser() -> argparse.ArgumentParser:
    parser = Parser(prog="python -m pretrain eval",
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
    run.add_argument("--backend", choices=BACKENDS, default="hf",
                     help="hf: SDPA, memory linear in L (default); megatron: FloatPositionGPTModel directly")
    run.add_argument("--train-window", type=int, help="training window w (required for HF dirs)")
    run.add_argument("--rope-scaling", choices=ROPE_SCALING_KINDS,
                     help="inference-time RoPE transform on top of the run's evaluation positions")
    run.add_argument("--factor", type=float, help="rope scaling factor (default: L_eval / w)")
    run.add_argument("--batch-size", type=int, help="spans per forward pass (default: from --max-batch-tokens)")
    run.add_argument("--max-batch-tokens", type=int, default=metrics.MAX_BATCH_TOKENS, help="token budget per forward pass")
    run.add_argument("--in-start", type=int, help="first in-distribution position of the cliff (default 64)")
    run.add_argument("--context-gain", type=_ints, default=[], help="contexts C for G(C), e.g. 1024,2048,4096")
    run.add_argument("--gain-window", type=int, default=512, help="sliding window of G(C) (paper: 512)")
    run.add_argument("--gain-method", choices=metrics.GAIN_METHODS, default="exact",
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
    run.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    run.add_argument("--output", "--out", dest="out", default="eval_results", help="directory for the JSON record")
    run.add_argument("--no-progress", action="store_true", help="no progress bars")

    every = sub.add_parser("all", help="evaluate every finished run under a directory not evaluated yet")
    every.add_argument("directory", help="directory of run directories (e.g. a grid of sizes × methods × seeds)")
    every.add_argument("--lengths", type=_ints, default=None, help="L_eval values (default: 8 × each run's window)")
    every.add_argument("--data", help="evaluation data for every run (default: each run's data.data_path)")
    every.add_argument("--num-spans", type=int, default=20, help="spans per length (paper: 20)")
    every.add_argument("--context-gain", type=_ints, default=[], help="contexts C for G(C), e.g. 1024,2048,4096")
    every.add_argument("--gain-window", type=int, default=512, help="sliding window of G(C) (paper: 512)")
    every.add_argument("--gain-method", choices=metrics.GAIN_METHODS, default="exact")
    every.add_argument("--backend", choices=BACKENDS, default="hf")
    every.add_argument("--max-batch-tokens", type=int, default=metrics.MAX_BATCH_TOKENS,
                       help="token budget per forward pass")
    every.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    every.add_argument("--output", "--out", dest="out", help="directory for the JSON records (default: DIRECTORY/eval_records)")
    every.add_argument("--no-progress", action="store_true", help="no progress lines")
    every.add_argument("--downstream", type=downstream.parse_tasks,
                       help="also lm-eval tasks for every finished run, e.g. hellaswag,arc_easy (see eval downstream)")
    every.add_argument("--num-fewshot", type=int, help="--downstream: few-shot examples (default: the task's)")
    every.add_argument("--limit", type=float, help="--downstream: examples per task (testing only)")
    every.add_argument("--include-path", help="--downstream: directory of your own lm-eval task YAML files")

    rep = sub.add_parser("report", help="aggregate records: CSV + Markdown tables and PNG plots")
    rep.add_argument("records", nargs="+", help="record JSON files or directories of them")
    rep.add_argument("--output", "--out", dest="out", default="eval_report", help="output directory")
    rep.add_argument("--baseline", help="method or label of the baseline; every size is compared with its own "
                     "(default: 'baseline' when such runs exist)")
    rep.add_argument("--length", type=int, help="L_eval for the loss-curve and cliff-vs-size plots (default: largest)")
    downstream.add_parser(sub)
    return parser


def _tokenizer_for(args, stream: TokenStream, scorer: Scorer):
    """The tokenizer to decode/encode prompts with, checked against the data's and the run's."""
    from data_prep.tokenizers import load_tokenizer

    run_manifest = _run_manifest(scorer)
    candidates = [args.tokenizer, stream.tokenizer_path, run_manifest and run_manifest.tokenizer_path]
    if scorer.backend == "hf" and os.path.isfile(os.path.join(scorer.info.source, "tokenizer.json")):
        candidates.append(os.path.join(scorer.info.source, "tokenizer.json"))
    path = next((c for c in candidates if c), None)
    tokenizer = load_tokenizer(path) if path else None
    if tokenizer is not None and tokenizer.vocab_size > scorer.vocab_size:
        raise ValueError(f"tokenizer {path} has {tokenizer.vocab_size} tokens but the model only "
                         f"{scorer.vocab_size}: the model was not trained with this tokenizer")
    if run_manifest is not None and not args.allow_tokenizer_mismatch:
        expected = run_manifest.tokenizer_sha256
        for what, sha in (("evaluation data", stream.tokenizer_sha256),
                          ("--tokenizer", tokenizer.sha256 if tokenizer is not None and args.tokenizer else None)):
            if expected and sha and sha != expected:
                raise ValueError(f"the {what} was tokenised with a different tokenizer (sha256 {sha[:12]}) than "
                                 f"the run was trained with ({run_manifest.tokenizer_path}, sha256 {expected[:12]}); "
                                 "pass --allow-tokenizer-mismatch to evaluate anyway")
    return tokenizer


def _run_manifest(scorer: Scorer):
    from data_prep.manifest import load_manifest, manifest_path

    data_path = scorer.info.extra.get("data_path")
    if data_path and os.path.isfile(manifest_path(data_path)):
        return load_manifest(data_path)
    return None


def _run(args) -> int:
    scorer = load_scorer(args.model, backend=args.backend, train_window=args.train_window,
                         rope_scaling=args.rope_scaling, factor=args.factor, name=args.name, device=args.device)
    if not (args.lengths or args.context_gain or args.passkey_lengths or args.ruler_lengths):
        raise ValueError("nothing to evaluate: pass --lengths and/or --context-gain, --passkey-lengths, --ruler-lengths")
    tokenizer_path = args.tokenizer
    if tokenizer_path is None and scorer.backend == "hf" and (Path(args.model) / "config.json").is_file():
        tokenizer_path = args.model  # an HF directory usually ships its tokenizer
    stream = load_stream(args.data, tokenizer_path, text_key=args.text_key)
    if stream.vocab_size is not None and stream.vocab_size > scorer.vocab_size:
        raise ValueError(f"the data's tokenizer has {stream.vocab_size} tokens, the model {scorer.vocab_size}: "
                         "they do not match")
    tokenizer = _tokenizer_for(args, stream, scorer) if (args.passkey_lengths or args.ruler_lengths
                                                         or _run_manifest(scorer)) else None
    batch_size = args.batch_size
    record = evaluate(
        scorer, stream, args.lengths, args.num_spans,
        batch_size=batch_size, max_batch_tokens=args.max_batch_tokens, in_start=args.in_start, gain_contexts=args.context_gain,
        gain_window=args.gain_window, gain_method=args.gain_method, kv_chunk=args.kv_chunk,
        passkey_lengths=args.passkey_lengths, passkey_n=args.passkey_n, ruler_lengths=args.ruler_lengths,
        ruler_n=args.ruler_n, tokenizer=tokenizer, entropy_spans=args.entropy_spans, label=args.label,
        seed=args.seed, progress=not args.no_progress)
    if batch_size is None:
        record["max_batch_tokens"] = args.max_batch_tokens
    suffix = f"_{record['rope_scaling']}" if record["rope_scaling"] else ""
    path = report.write_record(record, Path(args.out) / f"{record['run']}{suffix}.json")
    for length, entry in record["lengths"].items():
        cliff = entry.get("cliff")
        extra = f"  cliff {cliff['cliff']:+.4f} (in {cliff['in_dist']:.4f}, ood {cliff['ood']:.4f})" if cliff else ""
        print(f"L={length}: loss {entry['loss']:.4f}{extra}")
    if record.get("context_gain"):
        g = record["context_gain"]
        print(f"G(C) [{g['method']}, window {g['window']}]: "
              + ", ".join(f"G({c})={v:+.4f}" for c, v in g["values"].items()))
    for task in ("passkey", "ruler_niah"):
        for length, entry in (record.get(task) or {}).items():
            print(f"{task}@{length}: {entry['accuracy']:.3f} (n={entry['n']})")
    if record.get("entropy"):
        print(f"attention entropy ratio (ood/in): {record['entropy']['ratio']:.4f}")
    print(f"wrote {path}")
    return 0


def _report(args) -> int:
    records = report.load_records(args.records)
    baseline = args.baseline
    if baseline is None and any("baseline" in (report.record_method(r), r.get("label")) for r in records):
        baseline = "baseline"
    rows = report.aggregate(records, baseline=baseline)
    out = Path(args.out)
    report.write_csv(rows, out / "summary.csv")
    table = report.size_table(rows, args.length)
    (out / "summary.md").write_text(report.markdown_table(rows) + "\n" + table)
    report.plot_loss_curves(records, out / "loss_curves.png", length=args.length)
    if any(r.get("context_gain") for r in records):
        report.plot_context_gain(records, out / "context_gain.png")
    report.plot_cliff_vs_size(records, out / "cliff_vs_size.png", length=args.length)
    print(table, end="")
    if any(r.get("downstream") for r in records):
        from .downstream_report import downstream_table

        scores = downstream_table(records, baseline)
        (out / "summary.md").write_text((out / "summary.md").read_text() + "\n" + scores)
        print(scores, end="")
    print(f"wrote {out}/summary.csv, summary.md (all metrics) and plots"
          + (f"; each size compared with its own {baseline!r}" if baseline else ""))
    return 0


_AT_LEAST = {1: ("num_spans", "batch_size", "max_batch_tokens", "train_window", "gain_window", "kv_chunk", "passkey_n",
                 "ruler_n", "length", "lengths", "context_gain", "passkey_lengths", "ruler_lengths", "context_length"),
             0: ("in_start", "entropy_spans", "num_fewshot", "seed")}


def _check_ranges(args) -> None:
    """ValueError naming the flag when a count, length or size is out of range (--batch-size 0)."""
    for least, names in _AT_LEAST.items():
        for name in names:
            value = getattr(args, name, None)
            for item in (value if isinstance(value, list) else [value]):
                if item is not None and item < least:
                    flag = "--" + name.replace("_", "-")
                    raise ValueError(f"{flag} must be {'positive' if least else 'zero or more'}, got {item}")
    factor = getattr(args, "factor", None)
    if factor is not None and not factor >= 1:  # also NaN
        raise ValueError(f"--factor must be at least 1 (a context extension), got {factor}")
    limit = getattr(args, "limit", None)
    if limit is not None and not limit > 0:
        raise ValueError(f"--limit must be positive (a count, or a fraction of each task), got {limit}")


def _inputs(args) -> dict:
    """What an eval command reads, by flag (its --out must lie apart from them)."""
    if args.command == "report":
        return {f"record {path}": path for path in args.records}
    named = {"MODEL": getattr(args, "model", None), "DIRECTORY": getattr(args, "directory", None),
             "--data": getattr(args, "data", None), "--tokenizer": getattr(args, "tokenizer", None)}
    return {flag: path for flag, path in named.items() if isinstance(path, str)}


def eval_cli(argv: list[str]) -> int:
    """Entry point of `python -m pretrain eval`; returns the exit code."""
    argv = list(argv)
    if argv and argv[0] not in ("run", "all", "report", "downstream") and not argv[0].startswith("-") \
            and (os.sep in argv[0] or os.path.exists(argv[0])):
        argv = ["run", *argv]  # `eval MODEL --data ...` means `eval run MODEL ...`; a bare `eval reprot` is refused
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        _check_ranges(args)
        directory = getattr(args, "directory", None)  # `eval downstream` has none: its default is the run's
        out = args.out or (Path(directory) / "eval_records" if directory and Path(directory).is_dir() else None)
        if out is not None:  # records and reports never go where the command reads from
            check_apart(out, _inputs(args), "--out", inside_ok=args.command != "run")
        if args.command != "report" and out is not None:  # before hours of evaluation, not after
            check_writable(out, what="evaluation output directory", elsewhere="pass an --out on a larger disk",
                           then="rerun the same command")
        if args.command == "all":
            from .all_runs import evaluate_all

            outcome = evaluate_all(args.directory, lengths=args.lengths, data=args.data, num_spans=args.num_spans,
                                   out=args.out, backend=args.backend, device=args.device,
                                   context_gain=args.context_gain, gain_window=args.gain_window,
                                   gain_method=args.gain_method, max_batch_tokens=args.max_batch_tokens,
                                   progress=not args.no_progress,
                                   downstream=None if not args.downstream else dict(
                                       tasks=args.downstream, num_fewshot=args.num_fewshot, limit=args.limit,
                                       include_path=args.include_path))
            return 1 if outcome["failed"] else 0
        if args.command == "downstream":
            return downstream.run_cli(args)
        return _run(args) if args.command == "run" else _report(args)
    except (ValueError, FileNotFoundError, OutputError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
