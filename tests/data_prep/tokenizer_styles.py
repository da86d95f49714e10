"""Small byte-level BPE tokenizer.json files laid out like the real ones of six families, for tests and benchmarks.

The real files cannot be downloaded where this project is tested, so each family's layout is
reproduced with `tokenizers` itself on a small training text. What each reproduces, and what
stays unverified without the real file, is listed in benchmarks/results/data_prep_tokenizers_notes.md ("What the test tokenizer files reproduce").

- gpt2: ByteLevel with GPT-2's regex, all 256 byte tokens, <|endoftext|> and <|padding|> special.
- neox: GPT-NeoX-20B's file (Pythia uses the same one): NFC; ids 0/1 <|endoftext|>/<|padding|>,
  special, not normalised, also in the model vocab; the 243 byte tokens UTF-8 text can need at
  ids 2-244 (no token for 0xC0, 0xC1, 0xF5-0xFF); merges in id order from 245, written as
  "a b" strings; 23 non-special, normalised added tokens of 24 down to 2 spaces after the model
  vocab, longest first; ByteLevel post-processor and decoder; none of the keys newer
  `tokenizers` versions write (use_regex, byte_fallback, ignore_merges).
- olmo: OLMo-1's variant of the NeoX file: id 0 is |||IP_ADDRESS|||, and |||EMAIL_ADDRESS|||,
  |||PHONE_NUMBER||| and <|endoftext|> (its EOS) follow the whitespace tokens, all special.
- llama3: Split (Llama-3's regex) + ByteLevel without regex, ignore_merges.
- qwen2: NFC, Split (Qwen2's regex: single digits) + ByteLevel without regex.
- deepseek3: DeepSeek-V3's pre-tokenizer, a Sequence of three Isolated Splits (digits in groups of
  1-3, runs of CJK characters, the main regex) + ByteLevel without regex; an empty normalizer
  Sequence; 1,283 added tokens (3 special in the vocab, 1,266 special placeholders, 14 non-special).
"""

from __future__ import annotations

import json
from typing import Iterable

# Pre-tokenisation regexes of the families, as their tokenizer.json files spell them.
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = LLAMA3_PATTERN.replace(r"\p{N}{1,3}", r"\p{N}")
DEEPSEEK3_PATTERNS = (
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^""" + "\r\n" + r"""\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"""
    r"""| ?[\p{P}\p{S}]+[""" + "\r\n" + r"""]*|\s*[""" + "\r\n" + r"""]+|\s+(?!\S)|\s+""",
)
STYLES = ("gpt2", "neox", "olmo", "llama3", "qwen2", "deepseek3")
NEOX_WHITESPACE = [" " * n for n in range(24, 1, -1)]  # GPT-NeoX-20B's added tokens 50254-50276
DEEPSEEK3_NON_SPECIAL = ["<｜fim▁hole｜>", "<｜fim▁begin｜>", "<｜fim▁end｜>", "<｜User｜>", "<｜Assistant｜>",
                         "<|EOT|>", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
                         "<｜tool▁call▁end｜>", "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>",
                         "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>"]


def train_styled_tokenizer(style: str, texts: Iterable[str], vocab_size: int) -> str:
    """A byte-level BPE of `vocab_size` model tokens trained on `texts`, laid out like `style`'s file; its JSON."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    from data_prep.bpe_fast import NON_UTF8_BYTES, bytes_to_unicode

    if style not in STYLES:
        raise ValueError(f"style {style!r}: want one of {STYLES}")
    specials = {"llama3": ["<|begin_of_text|>", "<|end_of_text|>"],
                "qwen2": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                "deepseek3": ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"],
                "olmo": ["|||IP_ADDRESS|||", "<|padding|>"]}.get(style, ["<|endoftext|>", "<|padding|>"])
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if style in ("neox", "olmo"):
        absent = {bytes_to_unicode()[b] for b in NON_UTF8_BYTES}
        alphabet = [c for c in alphabet if c not in absent]
    tok = Tokenizer(models.BPE(ignore_merges=style == "llama3"))
    if style in ("neox", "olmo", "qwen2"):
        tok.normalizer = normalizers.NFC()
    if style == "deepseek3":
        tok.normalizer = normalizers.Sequence([])
    if style in ("llama3", "qwen2", "deepseek3"):
        patterns = {"llama3": [LLAMA3_PATTERN], "qwen2": [QWEN2_PATTERN]}.get(style, DEEPSEEK3_PATTERNS)
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(p), behavior="isolated", invert=False) for p in patterns]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=alphabet)
    tok.train_from_iterator(texts, trainer)
    if style in ("neox", "olmo"):
        tok.add_tokens([AddedToken(t, normalized=True, special=False) for t in NEOX_WHITESPACE])
    if style == "olmo":
        tok.add_special_tokens([AddedToken(t, normalized=False, special=True)
                                for t in ("|||EMAIL_ADDRESS|||", "|||PHONE_NUMBER|||", "<|endoftext|>")])
    if style == "deepseek3":
        tok.add_special_tokens([AddedToken(f"<｜place▁holder▁no▁{k}｜>", normalized=False, special=True)
                                for k in range(1266)])
        tok.add_tokens([AddedToken(t, normalized=True, special=False) for t in DEEPSEEK3_NON_SPECIAL])
    text = tok.to_str()
    if style in ("neox", "olmo"):
        text = _neox_layout(text)
    return text


def _neox_layout(text: str) -> str:
    """The JSON as GPT-NeoX-20B's file spells it (written by tokenizers 0.10): old keys, "a b" merges."""
    spec = json.loads(text)
    model = spec["model"]
    model["merges"] = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    for key in ("byte_fallback", "ignore_merges"):
        model.pop(key, None)
    old_byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True}
    spec["pre_tokenizer"] = dict(old_byte_level)
    spec["post_processor"] = dict(old_byte_level)
    spec["decoder"] = dict(old_byte_level)
    added = []
    for t in spec["added_tokens"]:
        added.append({"id": t["id"], "special": t["special"], "content": t["content"], "single_word": False,
                      "lstrip": False, "rstrip": False, "normalized": t["normalized"]})
    spec["added_tokens"] = added
    order = ["version", "truncation", "padding", "added_tokens", "normalizer", "pre_tokenizer", "post_processor",
             "decoder", "model"]
    return json.dumps({k: spec[k] for k in order}, ensure_ascii=False, indent=2)
