"""`python -m pretrain eval run|all|report|downstream ...` and the `evaluate` API behind it."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

from pretrain.faults import OutputError, check_writable
from data_prep.overlap import check_apart

from . import downstream, memory, report
from .arguments import default_device, eval_parser
from .data import TokenStream, load_stream
from .record import evaluate
from .scorer_loading import load_scorer, resolve_backend
from .scorers import Scorer

log = logging.getLogger(__name__)


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


def _record_path(out: str, scorer) -> Path:
    """Where `eval run` writes the record of `scorer`: the run's name, plus its RoPE scaling if any."""
    scaling = scorer.rope_scaling
    return Path(out) / f"{scorer.info.name}{'' if scaling is None else '_' + scaling.kind}.json"


def _check_record_is_ours(path: Path, source: str) -> None:
    """ValueError when `path` holds the record of another model: re-evaluating a model replaces its own
    record, never another's (runs share a name when their configs keep the default one)."""
    if not path.is_file():
        return
    try:
        previous = json.loads(path.read_text()).get("source")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        previous = None
    if previous is not None and Path(previous).resolve() != Path(source).resolve():
        raise ValueError(f"{path} holds the record of {previous}, another model named {path.stem!r}; pass --name "
                         "(e.g. the run directory's name) or another --output")


def _run(args) -> int:
    # before any weight is read: a length that cannot fit fails in seconds, not after growing past memory
    wanted = memory.requests(args.lengths, args.context_gain, args.passkey_lengths, args.ruler_lengths,
                             args.entropy_spans)
    memory.check_fits(args.model, wanted, args.num_spans, args.batch_size, args.max_batch_tokens,
                      resolve_backend(args.model, args.backend), args.device, args.entropy_spans)
    scorer = load_scorer(args.model, backend=args.backend, train_window=args.train_window,
                         rope_scaling=args.rope_scaling, factor=args.factor, name=args.name, device=args.device,
                         overrides=args.overrides)
    if not (args.lengths or args.context_gain or args.passkey_lengths or args.ruler_lengths):
        raise ValueError("nothing to evaluate: pass --lengths and/or --context-gain, --passkey-lengths, --ruler-lengths")
    _check_record_is_ours(_record_path(args.out, scorer), scorer.info.source)
    tokenizer_path = args.tokenizer
    if tokenizer_path is None and scorer.backend == "hf" and (Path(args.model) / "config.json").is_file():
        tokenizer_path = args.model  # an HF directory usually ships its tokenizer
    stream = load_stream(args.data, tokenizer_path, text_key=args.text_key)
    if stream.note:
        print(f"note: {stream.note}", file=sys.stderr)
    if stream.vocab_size is not None and stream.vocab_size > scorer.vocab_size:
        raise ValueError(f"the data's tokenizer has {stream.vocab_size} tokens, the model {scorer.vocab_size}: "
                         "they do not match")
    tokenizer = _tokenizer_for(args, stream, scorer) if (args.passkey_lengths or args.ruler_lengths
                                                         or _run_manifest(scorer)) else None
    batch_size = args.batch_size
    if args.context_gain and args.gain_window is not None and args.gain_window >= scorer.train_window:
        print(f"warning: --gain-window {args.gain_window} is not below the training window {scorer.train_window}: "
              "G(C) then compares contexts longer than any the model trained on (default: w/4 below w = 2048)",
              file=sys.stderr)
    record = evaluate(
        scorer, stream, args.lengths, args.num_spans,
        batch_size=batch_size, max_batch_tokens=args.max_batch_tokens, in_start=args.in_start, gain_contexts=args.context_gain,
        gain_window=args.gain_window, gain_method=args.gain_method, kv_chunk=args.kv_chunk,
        passkey_lengths=args.passkey_lengths, passkey_n=args.passkey_n, ruler_lengths=args.ruler_lengths,
        ruler_n=args.ruler_n, tokenizer=tokenizer, entropy_spans=args.entropy_spans, label=args.label,
        seed=args.seed, progress=not args.no_progress)
    if batch_size is None:
        record["max_batch_tokens"] = args.max_batch_tokens
    path = report.write_record(record, _record_path(args.out, scorer))
    plot = None
    if record["lengths"]:  # beside the JSON: a null result shows at a glance
        plot = report.plot_loss_curves([record], path.with_suffix(".png"))
    if (record.get("run_info") or {}).get("phase"):
        print(f"DroPE phase: {record['run_info']['phase']} (checkpoint after step {record['run_info']['iteration']})")
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
    from .caveats import caveats

    for line in caveats(record):
        print(f"note: {line}")
    print(f"wrote {path}" + (f" and {plot.name}" if plot else ""))
    return 0


def _report(args) -> int:
    records = report.load_records(args.records)
    baseline = args.baseline
    if baseline is None and any("baseline" in (report.record_method(r), r.get("label")) for r in records):
        baseline = "baseline"
    rows = report.aggregate(records, baseline=baseline)
    out = Path(args.out)
    report.write_csv(rows, out / "summary.csv")
    notes = "".join(f"note: {line}\n" for line in report.pairing_notes(rows, baseline))
    table = report.size_table(rows, args.length) + notes
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
          + (f"; each run compared with the {baseline!r} run of its size and seed" if baseline else ""))
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
    """What an eval command reads, by flag (its --output must lie apart from them)."""
    if args.command == "report":
        return {f"record {path}": path for path in args.records}
    named = {"MODEL": getattr(args, "model", None), "DIRECTORY": getattr(args, "directory", None),
             "--data": getattr(args, "data", None), "--tokenizer": getattr(args, "tokenizer", None)}
    return {flag: path for flag, path in named.items() if isinstance(path, str)}


def eval_cli(argv: list[str]) -> int:
    """Entry point of `python -m pretrain eval`; returns the exit code."""
    args = default_device(eval_parser().parse_args(list(argv)))
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        _check_ranges(args)
        if getattr(args, "overrides", None):  # refused in a second, before any weight or data is read
            from pretrain.trainer.inference_model import check_inference_overrides

            check_inference_overrides(args.overrides)
        directory = getattr(args, "directory", None)  # `eval downstream` has none: its default is the run's
        out = args.out or (Path(directory) / "eval_records" if directory and Path(directory).is_dir() else None)
        if out is not None:  # records and reports never go where the command reads from
            check_apart(out, _inputs(args), "--output", inside_ok=args.command != "run")
        if args.command != "report" and out is not None:  # before hours of evaluation, not after
            check_writable(out, what="evaluation output directory", elsewhere="pass an --output on a larger disk",
                           then="rerun the same command")
        if args.command == "all":
            from .all_runs import evaluate_all

            outcome = evaluate_all(args.directory, lengths=args.lengths, data=args.data, num_spans=args.num_spans,
                                   out=args.out, backend=args.backend, device=args.device,
                                   context_gain=args.context_gain, gain_window=args.gain_window,
                                   gain_method=args.gain_method, max_batch_tokens=args.max_batch_tokens,
                                   progress=not args.no_progress, overrides=args.overrides,
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
