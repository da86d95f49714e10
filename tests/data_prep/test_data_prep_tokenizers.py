"""Tokenizers load from local files only and round-trip text; train-tokenizer produces loadable models."""

from __future__ import annotations

import os

import numpy as np
import pytest

from data_prep.readers import normalize
from data_prep.tokenizers import load_tokenizer
from data_prep.train_tokenizer import train_tokenizer
from data_prep.writer import megatron_indexed, token_dtype
from test_data_prep_helpers import make_docs, run_cli, train_bytelevel, write_txt_dir


@pytest.fixture(scope="module")
def tok_json(tmp_path_factory):
    return train_bytelevel(str(tmp_path_factory.mktemp("tok")))


@pytest.fixture(scope="module")
def sample():
    return [normalize(d) for d in make_docs(20, seed=5)]


def test_hf_tokenizer_json_round_trips_and_exposes_the_contract(tok_json, sample):
    tok = load_tokenizer(tok_json)
    assert tok.kind == "hf" and tok.path == tok_json and tok.vocab_size == 400
    assert tok.eod == 0  # <|endoftext|>, the first special token of the trainer
    assert tok.pad == 1 and isinstance(tok.unique_identifiers, dict)
    for text in sample:
        assert tok.decode(tok.encode(text)) == text


def test_directory_with_tokenizer_json_loads_it(tok_json):
    assert load_tokenizer(os.path.dirname(tok_json)).path == tok_json


def test_gpt2_vocab_and_merges_encode_exactly_like_the_same_bpe_as_tokenizer_json(tok_json, tmp_path, sample):
    from tokenizers import Tokenizer

    Tokenizer.from_file(tok_json).model.save(str(tmp_path))  # writes vocab.json + merges.txt
    gpt2 = load_tokenizer(str(tmp_path))
    hf = load_tokenizer(tok_json)
    assert gpt2.kind == "gpt2_bpe" and gpt2.eod == hf.eod
    for text in sample:
        assert gpt2.encode(text) == hf.encode(text)
        assert gpt2.decode(gpt2.encode(text)) == text


@pytest.mark.parametrize("kind", ["sentencepiece-bpe", "sentencepiece-unigram"])
def test_sentencepiece_training_gives_a_lossless_model(kind, tmp_path, sample):
    src = write_txt_dir(str(tmp_path / "src"), make_docs(80, seed=7))
    path = train_tokenizer([src], str(tmp_path / "sp"), kind, vocab_size=300)
    tok = load_tokenizer(path)
    assert tok.kind == "sentencepiece" and path.endswith(".model")
    assert tok.vocab_size >= 250 and tok.eod == 2 and tok.pad == 3
    for text in sample:
        assert tok.decode(tok.encode(text)) == text


def test_train_tokenizer_cli_writes_a_bytelevel_tokenizer(tmp_path):
    src = write_txt_dir(str(tmp_path / "src"), make_docs(30, seed=8))
    r = run_cli(["train-tokenizer", "--input", src, "--output", str(tmp_path / "t"), "--kind", "bytelevel-bpe",
                 "--vocab-size", "300", "--sample-bytes", "5000"], timeout=60)
    assert r.returncode == 0, r.stderr
    assert load_tokenizer(r.stdout.strip()).vocab_size == 300


def test_missing_tokenizer_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        load_tokenizer(str(tmp_path))


def test_token_dtype_follows_megatron_optimal_dtype():
    DType = megatron_indexed().DType
    for v in (400, 50257, 65499, 65500, 128256):
        assert token_dtype(v) == DType.optimal_dtype(v)
    assert token_dtype(50257) == np.uint16 and token_dtype(128256) == np.int32
