"""What a `build` is asked to do (BuildConfig) and what it works on (BuildPlan).

Below the pipeline and its stages, which all read them: the pipeline makes them, the
stages and the summary only consume them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from data_prep.tokenizers import Tokenizer
from data_prep.units import Unit
from data_prep.writer import token_dtype


@dataclass
class BuildConfig:
    """Everything `build` needs; the output-affecting part is fingerprinted for resume."""

    inputs: list[str]
    tokenizer: str
    output_prefix: str
    num_shards: int = 1
    valid_fraction: Optional[float] = None
    valid_docs: Optional[int] = None
    seed: int = 1234
    workers: int = 1
    jsonl_key: str = "text"
    fmt: str = "auto"
    normalize: str = "auto"  # "auto": the OpenWebText rule for OWT archives, text as is for every other format
    append_eod: bool = True
    eod_token: Optional[str] = None
    special_tokens: str = "text"  # a special token's string in a document: "text" (plain text) or "honour"
    invalid_utf8: str = "skip"  # a document that is not valid UTF-8: "skip" it, or "replace" bad bytes with U+FFFD
    strict: bool = False
    force: bool = False
    chunk_bytes: int = 4 << 20
    batch_docs: int = 64
    keep_work: bool = False
    progress: bool = True
    use_mpi: Optional[bool] = None

    def output_settings(self) -> dict:
        """Settings that change the bytes written (worker count deliberately absent)."""
        return {
            "num_shards": self.num_shards, "valid_fraction": self.valid_fraction, "valid_docs": self.valid_docs,
            "seed": self.seed, "jsonl_key": self.jsonl_key, "format": self.fmt, "normalize": self.normalize,
            "append_eod": self.append_eod, "eod_token": self.eod_token, "special_tokens": self.special_tokens,
            "strict": self.strict, "chunk_bytes": self.chunk_bytes,
            # only when not the default, so that builds made before the option keep their fingerprint
            **({"invalid_utf8": self.invalid_utf8} if self.invalid_utf8 != "skip" else {}),
        }


@dataclass
class BuildPlan:
    """What one build works on: tokenizer, units, their fingerprint and the work directory."""

    tokenizer: Tokenizer
    units: list[Unit]
    state: dict  # everything the fingerprint covers (fingerprint.build_state)
    fingerprint: str
    work_dir: str

    @property
    def dtype(self) -> type:
        """numpy dtype of token ids."""
        return token_dtype(self.tokenizer.vocab_size)
