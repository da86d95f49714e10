"""`build --normalize`: ids equal the tokenizer library's own encoding (+ EOD) of the text as given, or as normalised.

Megatron-LM's tools/preprocess_data.py encodes each JSON document's text unchanged
(`tokenizer.tokenize(text)`, then EOD with --append-eod); `--normalize none` (the default for
JSONL, parquet, arrow and text files) must give the same ids. Runtime ~15 s (two tokenizers).
"""

from __future__ import annotations

import re

import pytest

from data_prep.manifest import load_manifest
from data_prep.pipeline import BuildConfig, build
from test_data_prep_helpers import read_prefix_docs, train_bytelevel, write_jsonl, write_owt_dir, write_txt_dir

# Trailing newlines, leading spaces, runs of blank lines: everything the OpenWebText rule would rewrite.
DOCS = ["  First line\n\n\n\nafter four newlines\n\n", "tail spaces   \n", "a\n\n\n\n\n\nb",
        "\n\nleading blank lines", "plain text without anything odd", "  \n  x  \n\n\n"]


def owt_rule(text: str) -> str:
    """The Hugging Face openwebtext loader's cleanup, written out independently of data_prep."""
    return re.sub("\n\n\n+", "\n\n", text).strip()


@pytest.fixture(scope="module", params=["tokenizers", "sentencepiece"])
def reference(request, tmp_path_factory):
    """(tokenizer path, encode function from the tokenizer library itself, EOD id)."""
    root = tmp_path_factory.mktemp(request.param)
    if request.param == "tokenizers":
        from tokenizers import Tokenizer

        path = train_bytelevel(str(root))
        lib = Tokenizer.from_file(path)
        return path, lambda t: lib.encode(t, add_special_tokens=False).ids, lib.token_to_id("<|endoftext|>")
    import sentencepiece as spm

    from data_prep.train_tokenizer import train_tokenizer
    from test_data_prep_helpers import make_docs

    path = train_tokenizer([write_txt_dir(str(root / "src"), make_docs(60, seed=2) + DOCS)], str(root / "sp"),
                           "sentencepiece-bpe", vocab_size=300)
    lib = spm.SentencePieceProcessor(model_file=path)
    return path, lambda t: lib.encode(t), lib.eos_id()


def build_one_shard(inputs, tok, prefix, **kw) -> list[list[int]]:
    """Build with one train shard and no validation split, so documents stay in corpus order."""
    build(BuildConfig(inputs=inputs, tokenizer=tok, output_prefix=str(prefix), valid_docs=0, progress=False, **kw))
    return read_prefix_docs(load_manifest(str(prefix)).train_prefixes[0])


def test_jsonl_default_encodes_each_text_unchanged_then_eod(reference, tmp_path):
    tok, encode, eod = reference
    got = build_one_shard([write_jsonl(str(tmp_path / "d.jsonl"), DOCS)], tok, tmp_path / "o" / "c")
    assert got == [encode(d) + [eod] for d in DOCS]


def test_normalize_owt_encodes_the_openwebtext_cleaned_text(reference, tmp_path):
    tok, encode, eod = reference
    got = build_one_shard([write_jsonl(str(tmp_path / "d.jsonl"), DOCS)], tok, tmp_path / "o" / "c", normalize="owt")
    assert got == [encode(owt_rule(d)) + [eod] for d in DOCS]


def test_openwebtext_archives_default_to_the_owt_rule(reference, tmp_path):
    tok, encode, eod = reference
    got = build_one_shard([write_owt_dir(str(tmp_path / "owt"), [DOCS])], tok, tmp_path / "o" / "c")
    assert got == [encode(owt_rule(d)) + [eod] for d in DOCS]


def test_normalize_none_applies_to_openwebtext_archives_too(reference, tmp_path):
    tok, encode, eod = reference
    got = build_one_shard([write_owt_dir(str(tmp_path / "owt"), [DOCS])], tok, tmp_path / "o" / "c", normalize="none")
    assert got == [encode(d) + [eod] for d in DOCS]


def test_manifest_records_the_rule_per_format(reference, tmp_path):
    tok, _, _ = reference
    inputs = [write_jsonl(str(tmp_path / "d.jsonl"), DOCS), write_owt_dir(str(tmp_path / "owt"), [DOCS])]
    build_one_shard(inputs, tok, tmp_path / "o" / "c")
    m = load_manifest(str(tmp_path / "o" / "c"))
    assert m.normalize == "auto" and m.normalize_by_format == {"jsonl": "none", "owt": "owt"}
    assert m.raw["settings"]["normalize"] == "auto"
