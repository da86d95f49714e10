"""The JSON manifest written next to the shards, and its typed loader.

Format version 2 added `normalize` (the text rule per format), `input_files` (size, mtime and
sampled sha256 of every input, for resume) and `settings.normalize`. Version-1 manifests still
load; their builds normalised every document with the OpenWebText rule.
"""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass, field
from typing import Any

from pretrain.faults import naming_output

MANIFEST_VERSION = 2
_MANIFEST_SUFFIX = "_manifest.json"


def manifest_path(output_prefix: str) -> str:
    """Where the manifest of `output_prefix` lives."""
    return os.path.abspath(output_prefix) + _MANIFEST_SUFFIX


def shard_prefix(output_prefix: str, shard: int) -> str:
    """Path prefix (no .bin/.idx) of train shard `shard`."""
    return f"{os.path.abspath(output_prefix)}_{shard:05d}_text_document"


def valid_prefix(output_prefix: str) -> str:
    """Path prefix (no .bin/.idx) of the validation stream."""
    return f"{os.path.abspath(output_prefix)}_valid_text_document"


@dataclass
class Manifest:
    """What a finished build produced, as typed fields; `raw` holds the whole JSON document."""

    train_prefixes: list[str]
    valid_prefix: str
    tokenizer_path: str
    vocab_size: int
    eod_id: int
    num_tokens: int  # training tokens (validation excluded)
    num_valid_tokens: int
    raw: dict = field(repr=False, default_factory=dict)
    path: str = ""  # the manifest file itself
    tokenizer_kind: str = ""  # "hf", "gpt2_bpe" or "sentencepiece"
    tokenizer_sha256: str = ""  # over the tokenizer's file(s), as Tokenizer.sha256
    pad_id: int = -1
    token_dtype: str = ""  # numpy dtype name of the .bin files
    normalize: str = "owt"  # --normalize as requested: "auto", "none" or "owt"
    normalize_by_format: dict = field(default_factory=dict)  # input format -> rule applied ("none"/"owt")
    num_train_documents: int = 0
    num_valid_documents: int = 0
    fingerprint: str = ""
    encoder: str = ""  # library that produced the ids: "tiktoken" (exact fast BPE), "tokenizers", "sentencepiece"
    encoder_fallback_reason: str = ""  # why the fast BPE encoder was not used ("" when it was, or never applies)
    special_tokens: str = "text"  # a special token's string in a document: "text" or "honour" (--special-tokens)

    @classmethod
    def from_dict(cls, d: dict, base_dir: str, path: str = "") -> "Manifest":
        """Build from the JSON dict; relative prefixes are resolved against the manifest's directory."""
        def resolve(p: str) -> str:
            return p if os.path.isabs(p) else os.path.join(base_dir, p)

        tok = d["tokenizer"]
        normalize = d.get("normalize", {"requested": "owt", "by_format": {}})  # version 1: always the OWT rule
        return cls(
            train_prefixes=[resolve(s["prefix"]) for s in d["shards"]],
            valid_prefix=resolve(d["valid"]["prefix"]),
            tokenizer_path=tok["path"],
            vocab_size=int(tok["vocab_size"]),
            eod_id=int(tok["eod_id"]),
            num_tokens=int(sum(s["tokens"] for s in d["shards"])),
            num_valid_tokens=int(d["valid"]["tokens"]),
            raw=d,
            path=path,
            tokenizer_kind=tok.get("kind", ""),
            tokenizer_sha256=tok.get("sha256", ""),
            pad_id=int(tok.get("pad_id", tok["eod_id"])),
            token_dtype=tok.get("dtype", ""),
            normalize=normalize["requested"],
            normalize_by_format=dict(normalize["by_format"]),
            num_train_documents=int(sum(s["documents"] for s in d["shards"])),
            num_valid_documents=int(d["valid"]["documents"]),
            fingerprint=d.get("fingerprint", ""),
            encoder=tok.get("backend", ""),
            encoder_fallback_reason=tok.get("fallback_reason", ""),
            special_tokens=d.get("settings", {}).get("special_tokens", "text"),
        )

    @property
    def output_prefix(self) -> str:
        """The --data-prefix the build was given."""
        return self.path[: -len(_MANIFEST_SUFFIX)] if self.path.endswith(_MANIFEST_SUFFIX) else ""

    def rebuild_command(self) -> str:
        """The `python -m data_prep build` command line that rewrites these shards."""
        settings = self.raw.get("settings", {})
        args = ["python", "-m", "data_prep", "build"]
        for item in self.raw.get("inputs", []):
            args += ["--input", item["path"]]
        args += ["--tokenizer", self.tokenizer_path, "--data-prefix", self.output_prefix or "DATA_PREFIX",
                 "--num-shards", str(len(self.train_prefixes))]
        if settings.get("valid_docs") is not None:
            args += ["--valid-docs", str(settings["valid_docs"])]
        elif settings.get("valid_fraction") is not None:
            args += ["--valid-fraction", str(settings["valid_fraction"])]
        if "seed" in settings:
            args += ["--seed", str(settings["seed"])]
        if settings.get("normalize") not in (None, "auto"):
            args += ["--normalize", settings["normalize"]]
        if settings.get("special_tokens") not in (None, "text"):
            args += ["--special-tokens", settings["special_tokens"]]
        if settings.get("invalid_utf8") not in (None, "skip"):
            args += ["--invalid-utf8", settings["invalid_utf8"]]
        return shlex.join(args)

    def verify_shards(self, checksums: bool = False) -> None:
        """Raise ValueError naming the first shard file that is missing or not the size (or hash) recorded.

        Sizes are a stat per file; `checksums=True` also re-hashes every file (reads all shards).
        """
        from data_prep.checksums import sha256_file

        fix = f"fix: rebuild with `{self.rebuild_command()}` (add any other options of the original build)"
        entries = self.raw["shards"] + [self.raw["valid"]]
        for prefix, entry in zip(self.train_prefixes + [self.valid_prefix], entries):
            for ext in ("bin", "idx"):
                file = f"{prefix}.{ext}"
                if not os.path.isfile(file):
                    raise ValueError(f"{file}: shard named by {self.path} is missing; {fix}")
                size, recorded = os.path.getsize(file), entry.get(f"{ext}_bytes")
                if recorded is not None and size != recorded:
                    raise ValueError(f"{file} has {size} bytes but {self.path} records {recorded} "
                                     f"(truncated or overwritten); {fix}")
                if checksums and entry.get(f"{ext}_sha256") not in (None, sha256_file(file)):
                    raise ValueError(f"{file}: sha256 differs from {self.path} (corrupted or overwritten); {fix}")


def load_manifest(output_prefix: str) -> Manifest:
    """Load `DATA_PREFIX_manifest.json` (also accepts the manifest path itself)."""
    path = output_prefix if output_prefix.endswith(_MANIFEST_SUFFIX) else manifest_path(output_prefix)
    path = os.path.abspath(path)
    with open(path) as fh:
        d = json.load(fh)
    return Manifest.from_dict(d, os.path.dirname(path), path)


def write_json_atomic(path: str, obj: Any) -> None:
    """Write JSON so a crash leaves either the old file or the new one, never half of one."""
    tmp = f"{path}.tmp{os.getpid()}"
    with naming_output(path, partial=(tmp,)):
        with open(tmp, "w") as fh:
            json.dump(obj, fh, indent=1, sort_keys=False)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)


def read_json(path: str) -> Any:
    """JSON content of `path`, or None if missing or unreadable (e.g. half-written)."""
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None
