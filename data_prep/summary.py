"""The end of `build`: the manifest document, the closing report, and the no-documents error."""

from __future__ import annotations

import os
import sys
import time

import numpy as np

from data_prep import __version__
from data_prep.config import BuildConfig, BuildPlan
from pretrain.faults import DataError
from data_prep.manifest import MANIFEST_VERSION, manifest_path, write_json_atomic
from data_prep.units import Unit


def _tree_bytes(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def _skip_totals(unit_records: list[dict]) -> tuple[dict, list[str]]:
    skipped: dict[str, int] = {}
    examples: list[str] = []
    for record in unit_records:
        for reason, count in record["skipped"].items():
            skipped[reason] = skipped.get(reason, 0) + count
        examples.extend(record["skip_log"])
    return dict(sorted(skipped.items())), examples


def _replaced_totals(cfg: BuildConfig, unit_records: list[dict]) -> dict:
    """--invalid-utf8 and what it did: documents kept with U+FFFD, sequences replaced, the first few places."""
    out = {"mode": cfg.invalid_utf8, "documents": 0, "replacements": 0, "examples": []}
    for record in unit_records:
        replaced = record.get("invalid_utf8_replaced", {})  # absent in unit records of older versions
        out["documents"] += replaced.get("documents", 0)
        out["replacements"] += replaced.get("replacements", 0)
        out["examples"].extend(replaced.get("log", []))
    out["examples"] = out["examples"][:1000]
    return out


# The fix a no-documents error suggests, by the reason the documents were skipped.
_FIXES = {
    "missing_key": "pass --jsonl-key with the field holding the text (now {key!r})",
    "invalid_json": "pass --format matching the files",
    "invalid_utf8": "pass --invalid-utf8 replace to keep them with U+FFFD for each invalid byte sequence, or convert "
                    "the files to UTF-8 (e.g. iconv -f latin1 -t utf-8)",
    "empty": "give documents with text",
}


def no_documents_message(cfg: BuildConfig, units: list[Unit], unit_records: list[dict]) -> str:
    """One line for a build whose inputs yield no document: what was read, why each was skipped, the fix."""
    names = sorted({u.name for u in units})
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    read = sum(r["docs_read"] for r in unit_records)
    if read == 0:
        return (f"no documents to write: {shown} ({sum(u.est_bytes for u in units)} bytes) yielded 0 documents; "
                f"fix: point --input at a non-empty corpus (format {cfg.fmt!r}; --format picks the reader)")
    skipped, examples = _skip_totals(unit_records)
    reasons = ", ".join(f"{reason}: {count}" for reason, count in skipped.items())
    fixes = [_FIXES[r].format(key=cfg.jsonl_key) for r in skipped if r in _FIXES] or ["repair the documents named"]
    return (f"no documents to write: all {read} documents of {shown} were skipped ({reasons}; first: {examples[0]}); "
            f"fix: {'; or '.join(fixes)}")


def _normalize_record(cfg: BuildConfig, units: list[Unit]) -> dict:
    by_format: dict[str, str] = {}
    for unit in units:
        by_format.setdefault(unit.fmt, unit.normalize)
    return {"requested": cfg.normalize, "by_format": dict(sorted(by_format.items()))}


def write_manifest(cfg: BuildConfig, plan: BuildPlan, num_ranks: int, unit_records: list[dict], entries: dict, seconds: float) -> dict:
    """Check the document accounting, write the manifest, print the closing report; returns the manifest."""
    skipped, examples = _skip_totals(unit_records)
    shards = [entries[i] for i in range(cfg.num_shards)]
    valid = entries["valid"]
    read = sum(r["docs_read"] for r in unit_records)
    written = sum(e["documents"] for e in shards) + valid["documents"]
    num_skipped = sum(skipped.values())
    if read != written + num_skipped:  # never silently drop data
        raise DataError(f"accounting mismatch: read {read} != written {written} + skipped {num_skipped}")
    tokens = sum(e["tokens"] for e in shards) + valid["tokens"]
    tok = plan.tokenizer
    manifest = {
        "version": MANIFEST_VERSION,
        "data_prep_version": __version__,
        "fingerprint": plan.fingerprint,
        "created_unix": int(time.time()),
        "inputs": [{"path": os.path.abspath(p), "bytes": _tree_bytes(p)} for p in cfg.inputs],
        "input_files": plan.state["files"],
        "num_units": len(plan.units),
        "tokenizer": {"path": tok.path, "kind": tok.kind, "sha256": tok.sha256, "vocab_size": tok.vocab_size,
                      "eod_id": tok.eod, "pad_id": tok.pad, "dtype": np.dtype(plan.dtype).name,
                      "backend": tok.backend, "fallback_reason": tok.fallback_reason,
                      "special_tokens": cfg.special_tokens},
        "normalize": _normalize_record(cfg, plan.units),
        "settings": {**cfg.output_settings(), "workers": cfg.workers, "ranks": num_ranks},
        "documents": {"read": read, "written": written, "skipped": num_skipped,
                      "train": written - valid["documents"], "valid": valid["documents"]},
        "skipped_by_reason": skipped,
        "skipped_examples": examples[:1000],
        "invalid_utf8": _replaced_totals(cfg, unit_records),
        "tokens": {"total": tokens, "train": tokens - valid["tokens"], "valid": valid["tokens"]},
        "shards": shards,
        "valid": valid,
        "seconds": round(seconds, 2),
    }
    write_json_atomic(manifest_path(cfg.output_prefix), manifest)
    _print_report(cfg, manifest, sum(u.est_bytes for u in plan.units), seconds)
    return manifest


# What `eval run` needs by default on the shipped configs: 20 spans (its --num-spans) of 8 × w at w = 2048
# (pretrain/table.py EXTRAPOLATION and the shipped window; tests/data_prep/test_valid_split_report.py keeps them equal).
EVAL_SPANS, EVAL_WINDOWS, SHIPPED_WINDOW = 20, 8, 2048


def validation_line(valid_docs: int, valid_tokens: int) -> str:
    """The closing report's line on the validation split: what evaluation it allows, and the fix when too little."""
    span = EVAL_WINDOWS * SHIPPED_WINDOW
    head = f"validation: {valid_docs} document(s), {valid_tokens:,} tokens"
    if valid_tokens >= EVAL_SPANS * span:
        return f"{head}: enough for eval run's default {EVAL_SPANS} spans of {span:,} (8 × the shipped window)"
    largest = valid_tokens // (EVAL_SPANS * EVAL_WINDOWS)
    return (f"{head} = {valid_tokens // span} span(s) of {span:,} (8 × the shipped window {SHIPPED_WINDOW}); eval "
            f"run's default {EVAL_SPANS} spans at 8w need {EVAL_SPANS * span:,} tokens (this split allows them up to "
            f"w = {largest:,}): rebuild with --valid-docs N (this changes the training split too), or evaluate on "
            "held-out text with eval run --data FILE.jsonl --tokenizer TOK")


def _print_report(cfg: BuildConfig, manifest: dict, in_bytes: int, seconds: float) -> None:
    docs, tokens = manifest["documents"], manifest["tokens"]["total"]
    rate = max(seconds, 1e-9)
    print(f"\ndone in {seconds:.1f}s: {docs['read']} documents read = {docs['written']} written ({docs['train']} "
          f"train in {cfg.num_shards} shard(s), {docs['valid']} valid) + {docs['skipped']} skipped "
          f"{manifest['skipped_by_reason'] or ''}\n{tokens} tokens ({tokens / rate:,.0f} tokens/s, "
          f"{in_bytes / 1e6 / rate:.2f} MB/s input); manifest {manifest_path(cfg.output_prefix)}",
          file=sys.stderr, flush=True)
    print(validation_line(docs["valid"], manifest["tokens"]["valid"]), file=sys.stderr, flush=True)
    replaced = manifest["invalid_utf8"]
    if replaced["documents"]:
        print(f"invalid UTF-8: {replaced['replacements']} byte sequence(s) decoded as U+FFFD in "
              f"{replaced['documents']} document(s) (--invalid-utf8 replace; first: {replaced['examples'][0]})",
              file=sys.stderr)
    skipped_utf8 = manifest["skipped_by_reason"].get("invalid_utf8", 0)
    if skipped_utf8:
        print(f"invalid UTF-8: {skipped_utf8} document(s) skipped; to keep them pass --invalid-utf8 replace "
              "(or convert the input to UTF-8)", file=sys.stderr)
    empty = [e["prefix"] for e in manifest["shards"] if e["documents"] == 0]
    if empty:
        print(f"warning: {len(empty)} shard(s) received no documents: {empty[:3]} (use fewer shards)", file=sys.stderr)
