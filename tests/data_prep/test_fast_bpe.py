"""The fast BPE encoder gives exactly `tokenizers`' ids for every byte-level BPE tokenizer.json it accepts.

Each family's layout (GPT-2, GPT-NeoX, Llama-3, Qwen2) is trained small with `tokenizers` itself;
the reference is `tokenizers.Tokenizer.from_file(...).encode(text, add_special_tokens=False)`.
"""

from __future__ import annotations

import json

import pytest

from data_prep.bpe_fast import STYLES
from data_prep.tokenizers import load_tokenizer
from fast_bpe_helpers import edited, reference_ids, styled_tokenizers, texts_to_check, write_abc_tokenizer


@pytest.fixture(scope="module")
def styled(tmp_path_factory):
    return styled_tokenizers(str(tmp_path_factory.mktemp("styles")))


@pytest.mark.parametrize("style", STYLES)
def test_fast_path_is_taken_and_equals_tokenizers_on_adversarial_text(styled, style):
    tok = load_tokenizer(styled[style])
    assert tok.backend == "tiktoken", tok.fallback_reason
    texts = texts_to_check()
    assert tok.encode_batch(texts) == reference_ids(styled[style], texts)


@pytest.mark.parametrize("style", STYLES)
def test_honoured_special_tokens_equal_tokenizers_default_encoding(styled, style):
    tok = load_tokenizer(styled[style], special_tokens="honour")
    assert tok.backend == "tiktoken", tok.fallback_reason
    texts = texts_to_check()
    assert tok.encode_batch(texts) == reference_ids(styled[style], texts, honour=True)


def test_special_token_strings_are_plain_text_by_default(styled):
    text = "before<|endoftext|>after"
    plain = load_tokenizer(styled["neox"])
    honoured = load_tokenizer(styled["neox"], special_tokens="honour")
    assert plain.eod not in plain.encode(text)
    assert honoured.encode(text).count(honoured.eod) == 1
    assert plain.decode(plain.encode(text)) == text


def test_neox_whitespace_runs_are_the_added_tokens(styled):
    tok = load_tokenizer(styled["neox"])
    ids = tok.encode("a" + " " * 30 + "b")
    with open(styled["neox"], encoding="utf-8") as fh:
        added = {t["content"]: t["id"] for t in json.load(fh)["added_tokens"]}
    assert added[" " * 24] in ids and added[" " * 6] in ids


def test_merges_out_of_id_order_take_ranks_from_the_merge_list(styled, tmp_path):
    def reverse_merge_ids(spec):
        model = spec["model"]
        results = ["".join(m) if isinstance(m, list) else m.replace(" ", "") for m in model["merges"]]
        ids = sorted(model["vocab"][r] for r in results)
        for r, i in zip(results, reversed(ids)):  # the first merge gets the largest id
            model["vocab"][r] = i

    path = edited(styled["gpt2"], str(tmp_path / "shuffled.json"), reverse_merge_ids)
    tok = load_tokenizer(path)
    assert tok.backend == "tiktoken", tok.fallback_reason
    assert not tok.fast.ranks_are_ids  # ranks are merge indices, mapped back to ids
    texts = texts_to_check()
    assert tok.encode_batch(texts) == reference_ids(path, texts)


@pytest.mark.parametrize("normalizer, reason", [
    ({"type": "Lowercase"}, "normalizer Lowercase is not supported"),
    ({"type": "Sequence", "normalizers": [{"type": "NFD"}, {"type": "StripAccents"}]}, "normalizer Sequence"),
])
def test_an_unsupported_normalizer_falls_back_to_tokenizers_and_says_why(styled, tmp_path, normalizer, reason):
    path = edited(styled["neox"], str(tmp_path / "lower.json"), lambda s: s.update(normalizer=normalizer))
    tok = load_tokenizer(path)
    assert tok.backend == "tokenizers" and reason in tok.fallback_reason
    assert reason in repr(tok)
    texts = texts_to_check()
    assert tok.encode_batch(texts) == reference_ids(path, texts)


def test_an_unsupported_pre_tokenizer_falls_back(styled, tmp_path):
    def digits_first(spec):
        spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True}, spec["pre_tokenizer"]]}

    path = edited(styled["gpt2"], str(tmp_path / "digits.json"), digits_first)
    tok = load_tokenizer(path)
    assert tok.backend == "tokenizers" and "pre-tokenizer Sequence ['Digits', 'ByteLevel']" in tok.fallback_reason


def test_a_bpe_the_fast_encoder_gets_wrong_is_caught_by_the_sample_check(tmp_path):
    """Merges b+c before a+b, then ab+c: tokenizers makes [a, bc] of "abc"; tiktoken emits the token "abc"."""
    path = write_abc_tokenizer(str(tmp_path / "odd.json"))
    tok = load_tokenizer(path)
    assert tok.backend == "tiktoken"  # nothing in the file's structure gives it away
    assert tok.check_fast_path(["no trouble here", "xyz"]) is None and tok.backend == "tiktoken"
    reason = tok.check_fast_path(["no trouble here", "abc"])
    assert tok.backend == "tokenizers" and reason == tok.fallback_reason
    assert "differs from tokenizers on sampled document 1 at token 0" in reason
    assert tok.encode("abc") == reference_ids(path, ["abc"])[0]


def test_backend_env_tokenizers_turns_the_fast_path_off(styled, monkeypatch):
    monkeypatch.setenv("DATA_PREP_TOKENIZER_BACKEND", "tokenizers")
    tok = load_tokenizer(styled["neox"])
    assert tok.backend == "tokenizers" and "DATA_PREP_TOKENIZER_BACKEND=tokenizers" in tok.fallback_reason


def test_the_fast_encoder_survives_pickling_for_worker_processes(styled):
    import pickle

    tok = pickle.loads(pickle.dumps(load_tokenizer(styled["llama3"])))
    assert tok.backend == "tiktoken"
    texts = texts_to_check()
    assert tok.encode_batch(texts) == reference_ids(styled["llama3"], texts)


def test_irregular_whitespace_added_tokens_still_equal_tokenizers(styled, tmp_path):
    """Runs of 4 and 8 spaces only, a blank line and a space-tab pair: gaps, prefixes and mixed runs."""
    def irregular(spec):
        spec["added_tokens"] = [t for t in spec["added_tokens"] if t["special"]]
        top = max(spec["model"]["vocab"].values())
        for k, text in enumerate(["    ", "        ", "\n\n", " \t"]):
            spec["added_tokens"].append({"id": top + 1 + k, "content": text, "single_word": False, "lstrip": False,
                                         "rstrip": False, "normalized": True, "special": False})

    path = edited(styled["neox"], str(tmp_path / "irregular.json"), irregular)
    tok = load_tokenizer(path)
    texts = texts_to_check() + [" " * k + "x" for k in range(1, 20)] + ["\n" * k + " \t\t" * k for k in range(1, 6)]
    assert tok.backend == "tiktoken"
    assert tok.encode_batch(texts) == reference_ids(path, texts)
