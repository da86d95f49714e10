"""The manifest's typed API, shard verification, and the project's one streamed file hash. Runtime ~5 s."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from data_prep.checksums import sha256_file
from data_prep.manifest import load_manifest
from data_prep.pipeline import BuildConfig, build
from data_prep.tokenizers import load_tokenizer
from test_data_prep_helpers import make_docs, train_bytelevel, write_jsonl


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(output prefix, tokenizer path) of a small two-shard build."""
    root = tmp_path_factory.mktemp("built")
    tok = train_bytelevel(str(root / "tok"))
    src = write_jsonl(str(root / "d.jsonl"), make_docs(40, seed=5))
    prefix = str(root / "out" / "c")
    build(BuildConfig(inputs=[src], tokenizer=tok, output_prefix=prefix, num_shards=2, valid_docs=4, progress=False))
    return prefix, tok


def test_manifest_exposes_the_tokenizer_as_typed_fields(built):
    prefix, tok_path = built
    m, tok = load_manifest(prefix), load_tokenizer(built[1])
    assert (m.tokenizer_path, m.tokenizer_kind, m.tokenizer_sha256) == (tok_path, "hf", tok.sha256)
    assert (m.vocab_size, m.eod_id, m.pad_id, m.token_dtype) == (tok.vocab_size, tok.eod, tok.pad, "uint16")
    assert m.tokenizer_sha256 == m.raw["tokenizer"]["sha256"]


def test_manifest_exposes_counts_and_settings_as_typed_fields(built):
    m = load_manifest(built[0])
    assert (m.num_train_documents, m.num_valid_documents) == (36, 4)
    assert m.num_tokens == m.raw["tokens"]["train"] and m.num_valid_tokens == m.raw["tokens"]["valid"]
    assert m.path == built[0] + "_manifest.json" and len(m.fingerprint) == 64 and m.output_prefix == built[0]


def test_verify_shards_passes_on_a_complete_build(built):
    load_manifest(built[0]).verify_shards(checksums=True)


def test_verify_shards_names_a_missing_shard_and_the_rebuild_command(built, tmp_path):
    prefix = built[0]
    copy = tmp_path / "c"
    for f in os.listdir(os.path.dirname(prefix)):
        if not f.endswith("00001_text_document.idx"):
            (tmp_path / f).write_bytes(Path(os.path.dirname(prefix), f).read_bytes())
    with pytest.raises(ValueError) as err:
        load_manifest(str(copy)).verify_shards()
    msg = str(err.value)
    assert f"{copy}_00001_text_document.idx" in msg and "python -m data_prep build" in msg
    assert f"--data-prefix {copy}" in msg and "\n" not in msg


def test_verify_shards_names_a_truncated_shard(built, tmp_path):
    prefix = built[0]
    for f in os.listdir(os.path.dirname(prefix)):
        (tmp_path / f).write_bytes(Path(os.path.dirname(prefix), f).read_bytes())
    with open(tmp_path / "c_valid_text_document.bin", "r+b") as fh:
        fh.truncate(10)
    with pytest.raises(ValueError, match=r"c_valid_text_document.bin has 10 bytes"):
        load_manifest(str(tmp_path / "c")).verify_shards()


def test_version_1_manifest_still_loads_with_the_old_normalisation(built, tmp_path):
    raw = json.loads(Path(built[0] + "_manifest.json").read_text())
    raw["version"] = 1
    for key in ("normalize", "input_files"):
        raw.pop(key)
    raw["settings"].pop("normalize")
    (tmp_path / "old_manifest.json").write_text(json.dumps(raw))
    m = load_manifest(str(tmp_path / "old"))
    assert m.normalize == "owt" and m.tokenizer_sha256 == raw["tokenizer"]["sha256"] and m.raw == raw


def test_sha256_file_streams_the_same_digest_as_hashlib(tmp_path):
    data = os.urandom(9 << 20)  # several read blocks
    (tmp_path / "f").write_bytes(data)
    assert sha256_file(str(tmp_path / "f")) == hashlib.sha256(data).hexdigest()
