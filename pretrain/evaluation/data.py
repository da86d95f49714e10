"""Evaluation token streams and spans (PosAug paper §3).

A stream is one 1-D array of token ids: the validation split of a data_prep build (its
documents concatenated in stored order, EOD tokens included, as the trainer sees them), a
Megatron indexed dataset prefix, or a text / JSONL file tokenised on the fly. Spans are the
n contiguous slices at offsets 0, L, 2L, ... so every model and seed sees identical tokens.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch


@dataclass
class TokenStream:
    """Token ids of an evaluation source, plus what it was tokenised with (for mismatch checks)."""

    tokens: np.ndarray
    source: str
    tokenizer_path: str | None = None
    tokenizer_sha256: str | None = None
    vocab_size: int | None = None  # of the tokenizer that produced the ids, when known
    note: str | None = None  # what could not be checked about the source, said once by the command


def _indexed_tokens(prefix: str, max_tokens: int | None) -> np.ndarray:
    """Concatenate the documents of a Megatron .bin/.idx pair in stored order."""
    from data_prep.writer import megatron_indexed

    dataset = megatron_indexed().IndexedDataset(prefix, mmap=True)
    parts, total = [], 0
    for i in range(len(dataset)):
        doc = np.asarray(dataset[i])
        parts.append(doc)
        total += len(doc)
        if max_tokens is not None and total >= max_tokens:
            break
    if not parts:
        raise ValueError(f"{prefix}: the indexed dataset holds no documents")
    stream = np.concatenate(parts).astype(np.int64)
    return stream if max_tokens is None else stream[:max_tokens]


def _read_texts(path: Path, text_key: str) -> list[str]:
    """Documents of a .txt (the whole file, one document) or .jsonl/.json file (one per line)."""
    if path.suffix in (".jsonl", ".json"):
        texts = []
        with path.open() as fh:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                record = json.loads(line)
                if text_key not in record:
                    raise ValueError(f"{path}:{n}: no {text_key!r} field (pass --text-key)")
                texts.append(record[text_key])
        return texts
    # WikiText-style raw text: keep it as one document, the way perplexity papers evaluate it.
    return [path.read_text()]


def load_stream(source: str, tokenizer_path: str | None = None, *, text_key: str = "text",
                max_tokens: int | None = None) -> TokenStream:
    """Token stream of a data_prep prefix (validation split), an indexed prefix, or a text/JSONL file."""
    from data_prep.manifest import load_manifest, manifest_path

    if os.path.isfile(manifest_path(source)) or source.endswith("_manifest.json"):
        manifest = load_manifest(source)
        if not os.path.isfile(manifest.valid_prefix + ".bin"):
            raise FileNotFoundError(f"{source}: manifest names validation shard {manifest.valid_prefix}.bin, "
                                    "which does not exist")
        return TokenStream(_indexed_tokens(manifest.valid_prefix, max_tokens), source,
                           tokenizer_path=manifest.tokenizer_path, tokenizer_sha256=manifest.tokenizer_sha256,
                           vocab_size=manifest.vocab_size)
    if os.path.isfile(source + ".idx") and os.path.isfile(source + ".bin"):
        # ids alone: a model scored on another tokenizer's ids gives a number, not an error, hence the note
        return TokenStream(_indexed_tokens(source, max_tokens), source,
                           note=f"{source} is a bare .bin/.idx prefix with no data_prep manifest: the data's "
                                "tokenizer could not be checked against the run's (pass the build's --data-prefix, "
                                "whose manifest names it)")
    path = Path(source)
    if not path.is_file():
        raise FileNotFoundError(f"evaluation data {source!r}: not a data_prep prefix (no {manifest_path(source)}), "
                                "not a .bin/.idx prefix and not a text/JSONL file")
    if tokenizer_path is None:
        raise ValueError(f"{source} is raw text: pass --tokenizer (or evaluate an HF model directory "
                         "that ships its tokenizer)")
    from data_prep.tokenizers import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_path)
    ids: list[int] = []
    for text in _read_texts(path, text_key):
        ids.extend(tokenizer.encode(text))
        ids.append(tokenizer.eod)  # document separator, as data_prep writes it
        if max_tokens is not None and len(ids) >= max_tokens:
            break
    stream = np.asarray(ids if max_tokens is None else ids[:max_tokens], dtype=np.int64)
    return TokenStream(stream, source, tokenizer_path=tokenizer.path, tokenizer_sha256=tokenizer.sha256,
                       vocab_size=tokenizer.vocab_size)


def eval_spans(stream: np.ndarray | torch.Tensor | TokenStream, num_spans: int, length: int) -> torch.Tensor:
    """[n, L] spans at offsets 0, L, 2L, ... of the stream (paper §3); error if the stream is too short."""
    tokens = stream.tokens if isinstance(stream, TokenStream) else stream
    tokens = torch.as_tensor(np.asarray(tokens), dtype=torch.long)
    if num_spans < 1 or length < 2:
        raise ValueError(f"need num_spans >= 1 and length >= 2 (got {num_spans}, {length})")
    need = num_spans * length
    if tokens.numel() < need:
        raise ValueError(f"the evaluation stream has {tokens.numel()} tokens; {num_spans} spans of {length} "
                         f"need {need}: lower --num-spans or --lengths; rebuild the data with more validation "
                         "documents (data_prep build --valid-docs N; this changes the training split too); or "
                         "evaluate on held-out text: --data FILE.jsonl (or .txt) --tokenizer TOK")
    return tokens[:need].view(num_spans, length).clone()
