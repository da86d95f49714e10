"""Tokenizer files and reference encodings shared by the fast-BPE tests (no tests here)."""

from __future__ import annotations

import glob
import json
import os
import sysconfig

from tokenizer_styles import STYLES, train_styled_tokenizer
from test_data_prep_helpers import make_docs

STDLIB = sysconfig.get_paths()["stdlib"]

# Text built to find differences: what NFC changes, emoji (ZWJ, skin tones), CJK, long and mixed
# whitespace runs, tabs, CRLF, digit runs, special-token strings, contractions, empty documents.
ADVERSARIAL = [
    "",
    "cafe\u0301 vs caf\u00e9, A\u030a = \u00c5, \u1e0b\u0323 ordering, \ufb01 ligature, \u212b angstrom",
    "emoji \U0001F600\U0001F44D\U0001F3FD family \U0001F468\u200d\U0001F469\u200d\U0001F467 flags \U0001F1EF\U0001F1F5",
    "\u6771\u4eac\u90fd\u306b\u4f4f\u3080 \u4e2d\u6587\u5b57\u7b26 \ud55c\uad6d\uc5b4 \u0627\u0644\u0639\u0631\u0628\u064a\u0629",
    " " * 60 + "x" + " " * 25 + "y" + " " * 24 + "z " + " " * 23,
    "\t\t\t\tindent\n\t\t\tdef f():\n\t\treturn 1\t \t  \t\n",
    "line one\r\nline two\r\n\r\n\r\n  \r\n",
    "1234567890 3.14159 12,345,678 0000000 2024-11-25 ١٢٣٤ \u0968\u0966",
    "<|endoftext|> in text <|endoftext|><|endoftext|> and <|padding|><|im_start|>user<|end_of_text|>",
    "a  b   c    d     e \u00a0nbsp\u2003em\u3000ideo",
    "I'LL WE'VE they're it's don't O'Neil 's 'll",
    "\n\n\n   \n  \n \n",
    " ",
    "x" * 500 + "\u0301",
    # digit runs of every length, other scripts' digits, numerals that are not decimal digits
    "1 12 123 1234 12345 123456 1234567 12345678901234567890 v2.0.11 0x1F 3.14e-10 \uff11\uff12\uff13\uff14",
    "\u0663\u0664\u0665\u0666 \u0967\u0968\u0969\u096a \u00b2\u00b3 \u2167\u216b \u3007\u4e00\u4e8c 2024\u5e74",
    # mixed scripts and CJK runs next to Latin, digits and punctuation
    "\u6771\u4eac2024\u5e74\u30aa\u30ea\u30f3\u30d4\u30c3\u30afOlympics\u3002\u300c\u5f15\u7528\u300dabc\u4e2d\u6587",
    "\u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22 \u0939\u093f\u0928\u094d\u0926\u0940 "
    "\u05e2\u05d1\u05e8\u05d9\u05ea \u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac",
    # emoji with digits, keycaps, variation selectors and ZWJ next to letters
    "1\ufe0f\u20e3 #\ufe0f\u20e3 \u2764\ufe0f\U0001F9D1\u200d\U0001F4BB code\u200dword a\u200bb \U0001F600123",
    # control characters (C0, DEL, C1, separators tokenizers' \\s does not count as whitespace)
    "a\x00b\x01c\x1cd\x1de\x1ef\x1fg\x7fh\x85i\x9fj \x0b\x0c \u2028\u2029 end",
    # whitespace runs of every kind before words, punctuation and the end
    "x \t \t y\u00a0\u00a0\u00a0z\u3000\u3000w" + " " * 7 + "." + "\t" * 5 + "!" + "\n" * 4 + " " * 3,
    ".foo \"Hello ,bar ...baz ;x  --y",
]


def _corpus() -> list[str]:
    """Training text: stdlib json sources, generated documents and the adversarial strings."""
    texts = [open(p, encoding="utf-8").read() for p in sorted(glob.glob(os.path.join(STDLIB, "json", "*.py")))]
    return texts + make_docs(40, seed=3) + ADVERSARIAL * 3


def styled_tokenizers(root: str) -> dict[str, str]:
    """style -> path of a small tokenizer.json of that family's layout, written under `root`."""
    out = {}
    for style in STYLES:
        path = os.path.join(root, f"{style}.json")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(train_styled_tokenizer(style, _corpus(), vocab_size=700))
        out[style] = path
    return out


def texts_to_check() -> list[str]:
    """The adversarial strings, generated documents and some stdlib code."""
    code = [open(p, encoding="utf-8").read() for p in sorted(glob.glob(os.path.join(STDLIB, "email", "*.py")))[:6]]
    return ADVERSARIAL + make_docs(20, seed=11) + code


def reference_ids(path: str, texts: list[str], honour: bool = False) -> list[list[int]]:
    """`tokenizers`' own ids; special-token strings as text unless `honour`."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(path)
    tok.encode_special_tokens = not honour
    return [tok.encode(t, add_special_tokens=False).ids for t in texts]


def edited(path: str, out: str, edit) -> str:
    """Copy of a tokenizer.json with `edit(spec)` applied."""
    with open(path, encoding="utf-8") as fh:
        spec = json.load(fh)
    edit(spec)
    with open(out, "w", encoding="utf-8") as fh:
        json.dump(spec, fh)
    return out


def write_abc_tokenizer(path: str) -> str:
    """A hand-made byte-level BPE merging b+c before a+b, then ab+c: `tokenizers` makes [a, bc] of "abc",
    tiktoken's rank rule emits the token "abc" (nothing in the file's structure shows it)."""
    from data_prep.bpe_fast import bytes_to_unicode

    vocab = {c: i for i, c in enumerate(bytes_to_unicode().values())}
    vocab.update({"<|endoftext|>": 256, "bc": 257, "ab": 258, "abc": 259})
    spec = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [
        {"id": 256, "content": "<|endoftext|>", "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}],
        "normalizer": None, "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                                              "use_regex": True},
        "post_processor": None, "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                                            "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": [["b", "c"], ["a", "b"], ["ab", "c"]]}}
    with open(path, "w") as fh:
        json.dump(spec, fh)
    return path
