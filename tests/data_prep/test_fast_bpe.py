"""The fast BPE encoder gives exactly `tokenizers`' ids for every byte-level BPE tokenizer.json it accepts.

Each family's layout (GPT-2, GPT-NeoX-20B/Pythia, OLMo-1, Llama-3, Qwen2, DeepSeek-V3) is trained small with `tokenizers` itself;
the reference is `tokenizers.Tokenizer.from_file(...).encode(text, add_special_tokens=False)`.
"""

from __future__ import annotations

import json

import pytest

from tokenizer_styles import STYLES
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


def _reverse_merge_ids(spec):
    model = spec["model"]
    results = ["".join(m) if isinstance(m, list) else m.replace(" ", "") for m in model["merges"]]
    ids = sorted(model["vocab"][r] for r in results)
    for r, i in zip(results, reversed(ids)):  # the first merge gets the largest id
        model["vocab"][r] = i


def test_merges_out_of_id_order_take_ranks_from_the_merge_list(styled, tmp_path):
    path = edited(styled["gpt2"], str(tmp_path / "shuffled.json"), _reverse_merge_ids)
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


def test_neox_shaped_file_has_gpt_neox_20b_layout(styled):
    """The layout of GPT-NeoX-20B's tokenizer.json: what the fast path has to accept as is."""
    from data_prep.bpe_fast import NON_UTF8_BYTES, bytes_to_unicode

    with open(styled["neox"], encoding="utf-8") as fh:
        spec = json.load(fh)
    vocab, b2u = spec["model"]["vocab"], bytes_to_unicode()
    assert {b for b, c in b2u.items() if c not in vocab} == NON_UTF8_BYTES and len(NON_UTF8_BYTES) == 13
    assert [vocab["<|endoftext|>"], vocab["<|padding|>"]] == [0, 1]
    assert sorted(vocab[c] for c in b2u.values() if c in vocab) == list(range(2, 245))
    assert all(isinstance(m, str) for m in spec["model"]["merges"]) and "use_regex" not in spec["pre_tokenizer"]
    spaces = [t for t in spec["added_tokens"] if not t["special"]]
    assert [t["content"] for t in spaces] == [" " * n for n in range(24, 1, -1)]
    assert [t["id"] for t in spaces] == list(range(len(vocab), len(vocab) + 23))
    assert all(t["normalized"] for t in spaces) and spec["normalizer"] == {"type": "NFC"}


@pytest.mark.parametrize("style", ["neox", "olmo"])
def test_a_vocab_lacking_only_bytes_utf8_never_uses_takes_the_fast_path(styled, style):
    tok = load_tokenizer(styled[style])
    assert tok.backend == "tiktoken", tok.fallback_reason
    texts = texts_to_check()
    assert tok.encode_batch(texts) == reference_ids(styled[style], texts)


def test_a_vocab_missing_a_byte_utf8_uses_falls_back_and_says_which(styled, tmp_path):
    from data_prep.bpe_fast import NON_UTF8_BYTES, bytes_to_unicode

    with open(styled["neox"], encoding="utf-8") as fh:
        model = json.load(fh)["model"]
    in_merges = set("".join(m.replace(" ", "") for m in model["merges"]))
    byte = next(b for b, c in sorted(bytes_to_unicode().items())
                if b not in NON_UTF8_BYTES and c in model["vocab"] and c not in in_merges)
    path = edited(styled["neox"], str(tmp_path / "no_byte.json"),
                  lambda spec: spec["model"]["vocab"].pop(bytes_to_unicode()[byte]))
    tok = load_tokenizer(path)
    assert tok.backend == "tokenizers"
    assert (f"14 of the 256 byte tokens are missing from the vocab, 1 of them for bytes UTF-8 text uses "
            f"(e.g. byte 0x{byte:02X}") in tok.fallback_reason
    texts = texts_to_check()
    assert tok.encode_batch(texts) == reference_ids(path, texts)


def test_merges_out_of_id_order_in_a_vocab_lacking_non_utf8_bytes(styled, tmp_path):
    path = edited(styled["neox"], str(tmp_path / "shuffled.json"), _reverse_merge_ids)
    tok = load_tokenizer(path)
    assert tok.backend == "tiktoken" and not tok.fast.ranks_are_ids, tok.fallback_reason
    texts = texts_to_check()
    assert tok.encode_batch(texts) == reference_ids(path, texts)


def test_deepseek3_pre_tokenizer_runs_its_three_splits_on_the_fast_path(styled):
    with open(styled["deepseek3"], encoding="utf-8") as fh:
        spec = json.load(fh)
    assert [p["type"] for p in spec["pre_tokenizer"]["pretokenizers"]] == ["Split", "Split", "Split", "ByteLevel"]
    assert spec["normalizer"] == {"type": "Sequence", "normalizers": []} and len(spec["added_tokens"]) == 1283
    tok = load_tokenizer(styled["deepseek3"])
    assert tok.backend == "tiktoken" and len(tok.fast._steps) == 2  # the last split runs inside tiktoken
    assert tok.encode("2024") == reference_ids(styled["deepseek3"], ["2024"])[0]  # "202" "4": split, not merged


@pytest.mark.parametrize("step", [0, 2])  # a split run before tiktoken, and the one run inside it
@pytest.mark.parametrize("invert", [False, True])
@pytest.mark.parametrize("behavior", ["Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"])
def test_every_split_behaviour_equals_tokenizers(styled, tmp_path, step, behavior, invert):
    def set_behavior(spec):
        spec["pre_tokenizer"]["pretokenizers"][step].update(behavior=behavior, invert=invert)

    path = edited(styled["deepseek3"], str(tmp_path / "behavior.json"), set_behavior)
    tok = load_tokenizer(path)
    assert tok.backend == "tiktoken", tok.fallback_reason
    texts = texts_to_check()
    assert tok.encode_batch(texts) == reference_ids(path, texts)


def test_a_split_on_a_literal_string_equals_tokenizers(styled, tmp_path):
    def literal_splits(spec):
        steps = spec["pre_tokenizer"]["pretokenizers"]
        steps.insert(0, {"type": "Split", "pattern": {"String": ". "}, "behavior": "MergedWithPrevious",
                         "invert": False})
        steps[-2] = {"type": "Split", "pattern": {"String": "|"}, "behavior": "Isolated", "invert": False}

    path = edited(styled["deepseek3"], str(tmp_path / "literal.json"), literal_splits)
    tok = load_tokenizer(path)
    assert tok.backend == "tiktoken", tok.fallback_reason
    texts = texts_to_check() + ["a|b||c. d. e.|. "]
    assert tok.encode_batch(texts) == reference_ids(path, texts)


def test_a_split_regex_that_can_match_nothing_falls_back(styled, tmp_path):
    def empty_matching(spec):
        spec["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {"Regex": r"\p{N}*"}

    path = edited(styled["deepseek3"], str(tmp_path / "empty.json"), empty_matching)
    tok = load_tokenizer(path)
    assert tok.backend == "tokenizers" and "can match the empty string" in tok.fallback_reason


def test_many_added_tokens_split_out_as_tokenizers_does(styled):
    text = "x<｜User｜>y<｜place▁holder▁no▁7｜>z<｜place▁holder▁no▁77｜><｜User｜"
    with open(styled["deepseek3"], encoding="utf-8") as fh:
        ids = {t["content"]: t["id"] for t in json.load(fh)["added_tokens"]}
    plain, honoured = load_tokenizer(styled["deepseek3"]), load_tokenizer(styled["deepseek3"], special_tokens="honour")
    assert plain.encode(text) == reference_ids(styled["deepseek3"], [text])[0]
    assert honoured.encode(text) == reference_ids(styled["deepseek3"], [text], honour=True)[0]
    assert ids["<｜User｜>"] in plain.encode(text) and ids["<｜place▁holder▁no▁7｜>"] not in plain.encode(text)
    assert ids["<｜place▁holder▁no▁77｜>"] in honoured.encode(text)


def test_a_split_before_byte_level_with_its_own_regex_equals_tokenizers(styled, tmp_path):
    def digits_then_gpt2(spec):
        spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": r"\p{N}{1,3}"}, "behavior": "Isolated", "invert": False},
            spec["pre_tokenizer"]]}

    path = edited(styled["gpt2"], str(tmp_path / "digits_gpt2.json"), digits_then_gpt2)
    tok = load_tokenizer(path)
    assert tok.backend == "tiktoken" and len(tok.fast._steps) == 1, tok.fallback_reason
    texts = texts_to_check()
    assert tok.encode_batch(texts) == reference_ids(path, texts)
