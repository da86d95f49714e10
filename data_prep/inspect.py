"""`inspect`: counts, token-length summary, a decoded sample, and .idx/.bin consistency of shards."""

from __future__ import annotations

import os
from typing import Optional

import numpy as np

from data_prep.manifest import manifest_path, read_json


def _prefixes(prefix: str) -> tuple[list[str], Optional[dict]]:
    """Expand an output prefix (with a manifest) into its shard prefixes, or take one shard prefix."""
    prefix = os.path.abspath(prefix)
    for suffix in (".bin", ".idx", "_manifest.json"):
        if prefix.endswith(suffix):
            prefix = prefix[: -len(suffix)]
    man = read_json(manifest_path(prefix))
    if man:
        base = os.path.dirname(prefix)
        return [os.path.join(base, e["prefix"]) for e in man["shards"] + [man["valid"]]], man
    if os.path.exists(prefix + ".idx"):
        return [prefix], None
    raise FileNotFoundError(f"{prefix}: neither a manifest ({manifest_path(prefix)}) nor a .bin/.idx pair")


def _encoder_line(man: dict) -> str:
    """Which encoder produced the shards, as the manifest records it (older manifests did not)."""
    tok = man["tokenizer"]
    backend = tok.get("backend")
    if backend is None:
        return "encoder: not recorded (manifest written before data_prep recorded it)"
    special = man.get("settings", {}).get("special_tokens", "text")
    if backend == "tiktoken":
        return f"encoder: fast BPE (tiktoken), checked exact against tokenizers; special tokens in text: {special}"
    reason = f" (fast path not used: {tok['fallback_reason']})" if tok.get("fallback_reason") else ""
    return f"encoder: {backend}{reason}; special tokens in text: {special}"


def inspect(prefix: str, tokenizer: Optional[str] = None, sample_tokens: int = 200) -> int:
    """Print a report; returns the number of problems found (0 = all shards consistent)."""
    from data_prep.checksums import matches_checksums
    from data_prep.tokenizers import load_tokenizer
    from data_prep.writer import check_pair, open_pair

    prefixes, man = _prefixes(prefix)
    tok = None
    tok_path = tokenizer or (man["tokenizer"]["path"] if man else None)
    if tok_path:
        try:
            tok = load_tokenizer(tok_path)
        except (OSError, ValueError) as e:
            print(f"(no decoding: cannot load tokenizer {tok_path}: {e})")
    problems = 0
    all_lengths = []
    unreadable: set[str] = set()
    if man:
        d = man["documents"]
        print(f"manifest: {d['read']} documents read = {d['written']} written + {d['skipped']} skipped "
              f"{man['skipped_by_reason']}; tokenizer {man['tokenizer']['kind']} {man['tokenizer']['path']}")
        print(_encoder_line(man))
    for p in prefixes:
        issues = check_pair(p)
        if man:
            entry = next(e for e in man["shards"] + [man["valid"]] if os.path.basename(p) == e["prefix"])
            if not matches_checksums(p, entry):
                issues.append(f"{p}: checksums differ from the manifest")
        problems += len(issues)
        for msg in issues:
            print(f"PROBLEM: {msg}")
        if any("missing" in m or "unreadable" in m for m in issues):
            unreadable.add(p)
            continue
        ds = open_pair(p)
        lengths = np.asarray(ds.sequence_lengths, dtype=np.int64)
        all_lengths.append(lengths)
        status = "ok" if not issues else "INCONSISTENT"
        print(f"{os.path.basename(p)}: {len(ds.document_indices) - 1} documents, {int(lengths.sum())} tokens, "
              f"dtype {np.dtype(ds.index.dtype).name}, .idx/.bin {status}")
    if all_lengths:
        L = np.concatenate(all_lengths)
        if len(L):
            q = np.percentile(L, [50, 90, 99])
            print(f"document length (tokens): n={len(L)} mean={L.mean():.1f} min={L.min()} p50={q[0]:.0f} "
                  f"p90={q[1]:.0f} p99={q[2]:.0f} max={L.max()}")
            edges = np.unique(np.geomspace(1, max(2, L.max() + 1), num=9).astype(int))
            hist, _ = np.histogram(L, bins=edges)
            print("histogram: " + ", ".join(f"[{a},{b}): {h}" for a, b, h in zip(edges[:-1], edges[1:], hist)))
    if tok is not None:
        for p in (p for p in prefixes if p not in unreadable):
            ds = open_pair(p)
            if len(ds):
                ids = ds[0][:sample_tokens]
                print(f"sample ({os.path.basename(p)}, document 0, first {len(ids)} tokens):\n{tok.decode(ids)!r}")
                break
    print("all shards consistent" if problems == 0 else f"{problems} problem(s) found")
    return problems
