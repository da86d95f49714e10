"""Command line: `python -m data_prep {build,train-tokenizer,inspect,embedded-corpus}` (console script `data-prep`)."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Optional

from pretrain.cli import Parser  # one grammar with `python -m pretrain`
from pretrain.faults import FULL_OR_READ_ONLY, naming_output, one_line
from data_prep.overlap import check_apart
from data_prep.units import FORMATS, NORMALIZE_RULES


RENAMED = {"--output-prefix": "--data-prefix"}  # old name -> flag (manifests written before it print the old one)


def _renamed(argv: list[str]) -> list[str]:
    """argv with each deprecated flag written as its new name, saying so once (before parsing, so that argparse
    requires the new flag whichever name gave it)."""
    out = []
    for arg in argv:
        old, eq, value = arg.partition("=")
        if old in RENAMED:
            print(f"data_prep: warning: {old} is deprecated: write {RENAMED[old]} (the same value)", file=sys.stderr)
            arg = RENAMED[old] + eq + value
        out.append(arg)
    return out


def _build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m data_prep", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    b = sub.add_parser("build", help="tokenise a corpus into Megatron .bin/.idx shards")
    b.add_argument("--input", action="append", required=True, help="file or directory (repeatable)")
    b.add_argument("--tokenizer", required=True, help="tokenizer.json, dir with vocab.json+merges.txt, or .model")
    b.add_argument("--data-prefix", required=True,
                   help="OUT/name -> OUT/name_00000_text_document.bin ...; the name the trainer (data.data_path), "
                   "the launchers (DATA_PREFIX) and reproduce --slurm give it too")
    b.add_argument("--num-shards", type=int, default=1, help="training shards to write")
    g = b.add_mutually_exclusive_group()
    g.add_argument("--valid-fraction", type=float, default=None,
                   help="fraction of documents held out for validation (default 0.0005, at least 1 doc)")
    g.add_argument("--valid-docs", type=int, default=None, help="exact number of validation documents")
    b.add_argument("--seed", type=int, default=1234, help="seed of the document shuffle (split and shards)")
    b.add_argument("--workers", type=int, default=1, help="worker processes on this machine (per MPI rank)")
    b.add_argument("--jsonl-key", default="text", help="JSON key (or parquet/arrow column) holding the text")
    b.add_argument("--format", dest="fmt", default="auto", choices=FORMATS)
    b.add_argument("--normalize", default="auto", choices=NORMALIZE_RULES,
                   help="text cleanup before tokenising: none = text as stored (token ids identical to Megatron-LM's "
                        "preprocess_data.py), owt = the HF openwebtext loader's rule (collapse 3+ newlines to 2, "
                        "strip the ends); auto (default) = owt for OpenWebText archives, none for everything else")
    b.add_argument("--no-append-eod", dest="append_eod", action="store_false", help="do not end documents with EOD")
    b.add_argument("--eod-token", default=None, help="end-of-document token (default: found in the tokenizer)")
    b.add_argument("--special-tokens", default="text", choices=("text", "honour"),
                   help="a special token's string (<|endoftext|>, <|im_start|>) inside a document: text (default) = "
                        "tokenised as plain text, as Megatron-LM's preprocess_data.py does with GPT2BPETokenizer; "
                        "honour = encoded as the special token's id (tokenizer.json only), as Megatron-LM's "
                        "HuggingFaceTokenizer (transformers) does")
    b.add_argument("--invalid-utf8", default="skip", choices=("skip", "replace"),
                   help="a document (a JSONL line, a .txt file) that is not valid UTF-8: skip (default) = skipped and "
                        "counted; replace = kept, each invalid byte sequence decoded as U+FFFD (counted in the "
                        "closing report and the manifest)")
    b.add_argument("--strict", action="store_true", help="fail on the first bad document instead of skipping it")
    b.add_argument("--force", action="store_true", help="rebuild even if complete outputs exist")
    b.add_argument("--mpi", dest="use_mpi", action="store_true", default=None,
                   help="use MPI (auto-detected under mpirun/srun)")
    b.add_argument("--chunk-bytes", type=int, default=4 << 20, help="bytes per work unit cut from plain files")
    b.add_argument("--keep-work", action="store_true", help="keep intermediate work files after success")
    b.add_argument("--no-progress", dest="progress", action="store_false")

    t = sub.add_parser("train-tokenizer", help="train a tokenizer on a sample of a corpus")
    t.add_argument("--input", action="append", required=True)
    t.add_argument("--output", required=True, help="directory to save the tokenizer into")
    t.add_argument("--kind", required=True, choices=["sentencepiece-bpe", "sentencepiece-unigram", "bytelevel-bpe"])
    t.add_argument("--vocab-size", type=int, required=True)
    t.add_argument("--sample-bytes", type=int, default=100_000_000, help="bytes of the corpus the tokenizer trains on")
    t.add_argument("--format", dest="fmt", default="auto", choices=FORMATS)
    t.add_argument("--jsonl-key", default="text")

    i = sub.add_parser("inspect", help="report on (and check) written shards")
    i.add_argument("prefix", help="a build's --data-prefix (with manifest) or one shard prefix")
    i.add_argument("--tokenizer", default=None, help="tokenizer for the decoded sample (default: manifest's)")
    i.add_argument("--sample-tokens", type=int, default=200, help="tokens of the decoded sample")

    e = sub.add_parser("embedded-corpus", help="write the no-download demo corpus from Python's stdlib")
    e.add_argument("--output", required=True)
    e.add_argument("--max-bytes", type=int, default=5_000_000, help="size limit of the corpus in bytes")
    return p


# (inputs are read in the same blocks: a missing file there is a missing input, hence FULL_OR_READ_ONLY)
_ELSEWHERE = {"elsewhere": "pass an --output on a larger disk", "then": "rerun the same command"}


INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command ended by Ctrl-C


def _interrupted(signum, frame) -> None:
    """The first Ctrl-C: KeyboardInterrupt; the ones after it are ignored while the pool and the lock unwind
    (a second Ctrl-C there would end in a traceback from inside the clean-up)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def main(argv: Optional[list[str]] = None) -> int:
    """Run one command; returns the process exit code."""
    parser = _build_parser()
    args = parser.parse_args(_renamed(sys.argv[1:] if argv is None else list(argv)))
    previous = signal.getsignal(signal.SIGINT)
    ours = previous is signal.default_int_handler and threading.current_thread() is threading.main_thread()
    if ours:  # not where a caller chose its own handling (or cannot: another thread)
        signal.signal(signal.SIGINT, _interrupted)
    try:
        return _run(args)
    except KeyboardInterrupt:
        # inputs are only ever read; what was written stays where a rerun finds (and resumes or rewrites) it.
        # Ctrl-C stays ignored: the process is ending, and one more during the pool's exit would be a traceback.
        ours = False
        print(f"data_prep {args.command}: interrupted (Ctrl-C); nothing it read was changed; rerun the same command "
              "to continue (finished work is kept and resumed)", file=sys.stderr, flush=True)
        return INTERRUPTED
    finally:
        if ours:
            signal.signal(signal.SIGINT, previous)


def _run(args: argparse.Namespace) -> int:
    """The command `args` names; its exit code (bad input: one line, 2)."""
    try:
        if args.command == "build":
            from data_prep.pipeline import BuildConfig, build

            check_apart(args.data_prefix, [*(("--input", path) for path in args.input),
                                           ("--tokenizer", args.tokenizer)], "--data-prefix")
            kw = {k: v for k, v in vars(args).items() if k != "command"}
            kw["inputs"] = kw.pop("input")
            kw["output_prefix"] = kw.pop("data_prefix")  # BuildConfig's name: the prefix it writes
            build(BuildConfig(**kw))
            return 0
        if args.command == "train-tokenizer":
            from data_prep.train_tokenizer import train_tokenizer

            check_apart(args.output, [("--input", path) for path in args.input])
            with naming_output(args.output, what="tokenizer output", faults=FULL_OR_READ_ONLY, **_ELSEWHERE):
                path = train_tokenizer(args.input, args.output, args.kind, args.vocab_size, args.sample_bytes,
                                       args.fmt, args.jsonl_key)
            print(path)
            return 0
        if args.command == "inspect":
            from data_prep.inspect import inspect

            return 1 if inspect(args.prefix, args.tokenizer, args.sample_tokens) else 0
        if args.command == "embedded-corpus":
            from data_prep.corpus import write_embedded_corpus

            with naming_output(args.output, what="corpus output", faults=FULL_OR_READ_ONLY, **_ELSEWHERE):
                n, size = write_embedded_corpus(args.output, args.max_bytes)
            print(f"wrote {n} documents, {size} bytes to {args.output}", file=sys.stderr)
            return 0
    except (OSError, ValueError, RuntimeError) as e:
        print(f"data_prep {args.command}: error: {one_line(str(e))}", file=sys.stderr)
        return 2
    return 2


if __name__ == "__main__":
    sys.exit(main())
