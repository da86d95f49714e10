"""Which tokenizer an HF export ships (export.py): an imported model's files, an HF tokenizer directory given with
--tokenizer, or the run's own tokenizer (named by --tokenizer, import-hf's record or the run's data manifest) written
as HF files; with the special-token ids config.json and generation_config.json carry. A tokenizer larger than the
model's vocabulary is refused as the wrong one.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from pretrain.hf.tokenizer import copy_tokenizer_files, hf_tokenizer, special_token_ids


def _data_manifest(record: dict):
    """The run's data manifest (data_prep), or None when the config names no data path with one."""
    data_path = (record.get("config") or {}).get("data", {}).get("data_path")
    if data_path:
        from data_prep.manifest import load_manifest, manifest_path

        if Path(manifest_path(data_path)).is_file():
            return load_manifest(data_path)
    return None


def resolve_tokenizer_path(record: dict, explicit: str | None = None) -> str | None:
    """--tokenizer, else the one recorded by import-hf, else the run's data manifest's; None if none."""
    if explicit:
        return explicit
    if record.get("tokenizer_path"):
        return record["tokenizer_path"]
    manifest = _data_manifest(record)
    return manifest.tokenizer_path if manifest else None


def recorded_special_tokens(record: dict) -> str:
    """How the run's shards encoded a special token's string in text ("text" or "honour"; manifest setting)."""
    manifest = _data_manifest(record)
    return manifest.special_tokens if manifest else "text"


def _hf_tokenizer_dir(path: str | Path | None) -> Path | None:
    """`path` if it is a Hugging Face tokenizer directory (has tokenizer_config.json), else None."""
    return Path(path) if path and (Path(path) / "tokenizer_config.json").is_file() else None


class TokenizerSource:
    """Where an export's tokenizer files and special-token ids come from."""

    def __init__(self, record: dict, run_dir: Path, explicit: str | None, no_tokenizer: bool,
                 vocab_size: int) -> None:
        self.tok, self.hf_dir, self.ids, self.generation_config = None, None, {}, None
        if no_tokenizer:
            return
        # Files of an imported HF model (recorded by import-hf; also found if the run moved), or an
        # HF tokenizer directory given with --tokenizer, ship unchanged: a round trip encodes the same.
        candidates = [] if explicit or "hf_tokenizer_dir" not in record else [record["hf_tokenizer_dir"],
                                                                             run_dir / "tokenizer"]
        imported = next((Path(c) for c in candidates if Path(c).is_dir()), None)
        if imported is not None:
            self.hf_dir, self.ids = imported, dict(record.get("hf_token_ids") or {})
            if (imported / "generation_config.json").is_file():
                self.generation_config = imported / "generation_config.json"
            return
        if _hf_tokenizer_dir(explicit) is not None:
            from transformers import AutoTokenizer

            self.hf_dir = Path(explicit)
            auto = AutoTokenizer.from_pretrained(self.hf_dir)
            if len(auto) > vocab_size:
                raise ValueError(f"tokenizer {explicit} has {len(auto)} tokens but the model only {vocab_size}: "
                                 "wrong tokenizer? (pass the run's --tokenizer)")
            self.ids = {"bos_token_id": auto.bos_token_id, "eos_token_id": auto.eos_token_id,
                        "pad_token_id": auto.pad_token_id}
            return
        path = resolve_tokenizer_path(record, explicit)
        if path is None:
            raise ValueError("no tokenizer: the checkpoint records no data manifest with one; pass "
                             "--tokenizer PATH (tokenizer.json, a .model, vocab.json+merges.txt dir, or an HF "
                             "tokenizer dir), or --no-tokenizer to export the model alone")
        from data_prep.tokenizers import load_tokenizer

        self.tok = load_tokenizer(path, special_tokens=recorded_special_tokens(record))
        if self.tok.vocab_size > vocab_size:
            raise ValueError(f"tokenizer {path} has {self.tok.vocab_size} tokens but the model only "
                             f"{vocab_size}: wrong tokenizer? (pass the run's --tokenizer)")
        self.ids = special_token_ids(self.tok)

    def write(self, directory: Path) -> None:
        """Tokenizer files (and an imported model's generation_config.json) into `directory`."""
        if self.hf_dir is not None:
            copy_tokenizer_files(self.hf_dir, directory)
        if self.generation_config is not None:
            shutil.copyfile(self.generation_config, directory / "generation_config.json")
        elif self.tok is not None:
            hf_tokenizer(self.tok).save_pretrained(directory)
            if self.tok.kind == "sentencepiece":
                shutil.copyfile(self.tok.path, directory / "tokenizer.model")  # for sentencepiece-based loaders
