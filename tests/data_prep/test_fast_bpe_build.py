"""`build` with a tokenizer.json: the fast encoder is checked on the input, and which encoder ran is recorded.

Runtime ~30 s (trains six small tokenizers, runs a few one-shard builds).
"""

from __future__ import annotations

import pytest

from data_prep.inspect import inspect
from data_prep.manifest import load_manifest
from data_prep.pipeline import BuildConfig, build
from fast_bpe_helpers import ADVERSARIAL, edited, reference_ids, styled_tokenizers, write_abc_tokenizer
from test_data_prep_helpers import make_docs, read_prefix_docs, run_cli, write_jsonl


@pytest.fixture(scope="module")
def styled(tmp_path_factory):
    return styled_tokenizers(str(tmp_path_factory.mktemp("styles")))


def build_one_shard(docs, tok, tmp_path, **kw):
    """Build one shard, no validation split (corpus order kept); returns (documents' ids, manifest)."""
    prefix = str(tmp_path / "out" / "c")
    build(BuildConfig(inputs=[write_jsonl(str(tmp_path / "d.jsonl"), docs)], tokenizer=tok, output_prefix=prefix,
                      valid_docs=kw.pop("valid_docs", 0), progress=False, **kw))
    man = load_manifest(prefix)
    return read_prefix_docs(man.train_prefixes[0]), man


@pytest.mark.parametrize("style", ["neox", "llama3", "deepseek3"])
def test_build_with_the_fast_encoder_writes_tokenizers_ids_then_eod(styled, style, tmp_path):
    docs = ADVERSARIAL + make_docs(30, seed=4)
    got, man = build_one_shard(docs, styled[style], tmp_path)
    want = [ids + [man.eod_id] for ids in reference_ids(styled[style], docs) if ids]
    assert got == want
    assert man.encoder == "tiktoken" and man.encoder_fallback_reason == ""
    assert man.raw["skipped_by_reason"] == {"empty": 1}  # the empty document


def test_honour_special_tokens_is_recorded_and_changes_the_ids(styled, tmp_path):
    docs = ["one<|endoftext|>two", "plain"]
    got, man = build_one_shard(docs, styled["neox"], tmp_path, special_tokens="honour")
    assert got == [ids + [man.eod_id] for ids in reference_ids(styled["neox"], docs, honour=True)]
    assert got[0].count(man.eod_id) == 2 and man.special_tokens == "honour"
    assert "--special-tokens honour" in man.rebuild_command()


def test_unsupported_tokenizer_falls_back_once_with_the_reason_in_console_and_manifest(styled, tmp_path, capsys):
    path = edited(styled["neox"], str(tmp_path / "lower.json"), lambda s: s.update(normalizer={"type": "Lowercase"}))
    docs = make_docs(10, seed=6)
    got, man = build_one_shard(docs, path, tmp_path)
    assert got == [ids + [man.eod_id] for ids in reference_ids(path, docs)]
    assert man.encoder == "tokenizers" and "normalizer Lowercase is not supported" in man.encoder_fallback_reason
    assert capsys.readouterr().err.count("fast path not used: normalizer Lowercase is not supported") == 1


def test_a_vocab_missing_a_byte_utf8_uses_is_built_by_tokenizers_with_the_reason(styled, tmp_path, capsys):
    path = edited(styled["neox"], str(tmp_path / "no_tilde.json"), lambda s: s["model"]["vocab"].pop("~"))
    docs = make_docs(10, seed=6)
    got, man = build_one_shard(docs, path, tmp_path)
    assert got == [ids + [man.eod_id] for ids in reference_ids(path, docs)]
    reason = "14 of the 256 byte tokens are missing from the vocab, 1 of them for bytes UTF-8 text uses (e.g. byte 0x7E"
    assert man.encoder == "tokenizers" and reason in man.encoder_fallback_reason
    assert f"fast path not used: {reason}" in capsys.readouterr().err


def test_a_difference_on_the_sampled_input_falls_back_before_tokenising(tmp_path, capsys):
    path = write_abc_tokenizer(str(tmp_path / "abc.json"))
    docs = ["xyz", "the abc of it"]
    got, man = build_one_shard(docs, path, tmp_path)
    assert got == [ids + [man.eod_id] for ids in reference_ids(path, docs)]
    assert man.encoder == "tokenizers" and "differs from tokenizers on sampled document 1" in man.encoder_fallback_reason
    assert "fast path not used: the fast encoder differs" in capsys.readouterr().err


def test_an_input_the_sample_finds_exact_keeps_the_fast_encoder(tmp_path):
    got, man = build_one_shard(["xyz", "cab"], write_abc_tokenizer(str(tmp_path / "abc.json")), tmp_path)
    assert man.encoder == "tiktoken"


def test_inspect_names_the_encoder_that_produced_the_shards(styled, tmp_path, capsys):
    build_one_shard(make_docs(5, seed=1), styled["qwen2"], tmp_path, valid_docs=1)  # inspect cannot open an empty .bin
    capsys.readouterr()
    assert inspect(str(tmp_path / "out" / "c")) == 0
    assert "encoder: fast BPE (tiktoken), checked exact against tokenizers; special tokens in text: text" \
        in capsys.readouterr().out


def test_cli_rejects_an_unknown_special_tokens_mode(styled, tmp_path):
    r = run_cli(["build", "--input", write_jsonl(str(tmp_path / "d.jsonl"), ["x"]), "--tokenizer", styled["gpt2"],
                 "--data-prefix", str(tmp_path / "o"), "--special-tokens", "maybe"])
    assert r.returncode == 2 and "--special-tokens" in r.stderr and "Traceback" not in r.stderr
