"""The pre-tokenizer of a byte-level BPE `tokenizer.json` as the fast encoder (bpe_fast.py) runs it: `Split`
steps run with the `regex` module exactly as HF `tokenizers` runs them, and the regex left for tiktoken.

A pre-tokenizer `Sequence` of `Split` steps followed by `ByteLevel` is run as `tokenizers` runs it: each step
splits every piece the previous one left; all steps but the last run here, the last one inside tiktoken (its
regex, plus an alternative for the text between matches, which `Split` keeps and tiktoken would drop).
Whatever cannot be reproduced raises `Unsupported` with the reason.
"""

from __future__ import annotations

from typing import Optional

# GPT-2's pre-tokenisation pattern: the one `tokenizers`' ByteLevel pre-tokenizer (use_regex), tiktoken's
# "gpt2" encoding and Megatron's GPT2BPETokenizer all use.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
SPLIT_BEHAVIORS = ("Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous")


class Unsupported(ValueError):
    """The tokenizer.json uses something the fast encoder does not reproduce (the message says what)."""


# A probe for Split patterns that can match the empty string: `tokenizers` (Oniguruma) and Python's
# `regex` step past an empty match differently, so such patterns are left to `tokenizers`.
_EMPTY_MATCH_PROBE = "Ab c1 23\t\n\r\n  x!?.'s \u00e9e\u0301 \u4e00\u3042\u30a2 \U0001F600\u200d\U0001F469 \u0661\x00\x1c"
_RUST_META = set("\\.+*?()|[]{}^$#&-~")


def _pattern_source(split: dict, for_rust: bool) -> str:
    """The Split step's regex source; a String pattern is matched literally, as `tokenizers` escapes it."""
    pattern = split.get("pattern") or {}
    if "Regex" in pattern:
        return pattern["Regex"]
    if "String" in pattern:
        import regex

        text = pattern["String"]
        return "".join("\\" + c if c in _RUST_META else c for c in text) if for_rust else regex.escape(text)
    raise Unsupported(f"pre-tokenizer Split with pattern {pattern!r} is not supported")


class SplitStep:
    """One `Split` pre-tokenizer step, run with the `regex` module exactly as `tokenizers` runs it."""

    def __init__(self, split: dict) -> None:
        import regex

        self.behavior, self.invert = split.get("behavior"), bool(split.get("invert"))
        if self.behavior not in SPLIT_BEHAVIORS:
            raise Unsupported(f"pre-tokenizer Split with behavior {self.behavior!r} is not supported")
        self.source = _pattern_source(split, for_rust=False)
        try:
            self.rx = regex.compile(self.source)
        except regex.error as e:
            raise Unsupported(f"pre-tokenizer Split regex {self.source!r} not accepted by the regex module ({e})") \
                from None
        if any(m.start() == m.end() for m in self.rx.finditer(_EMPTY_MATCH_PROBE)) or self.rx.fullmatch(""):
            raise Unsupported(f"pre-tokenizer Split regex {self.source!r} can match the empty string")
        # Isolated, not inverted, is every piece in order: one C-level split when the pattern has no groups.
        self._whole = regex.compile(f"({self.source})") if self.rx.groups == 0 else None

    def split(self, text: str) -> list[str]:
        """The non-empty pieces `tokenizers`' Split leaves of `text`."""
        if self._whole is not None and self.behavior == "Isolated" and not self.invert:
            return [p for p in self._whole.split(text) if p]
        spans, prev = [], 0
        for m in self.rx.finditer(text):
            start, end = m.span()
            if prev != start:
                spans.append([prev, start, self.invert])
            spans.append([start, end, not self.invert])
            prev = end
        if prev != len(text):
            spans.append([prev, len(text), self.invert])
        return [text[a:b] for a, b in self._group(spans)]

    def _group(self, spans: list[list]) -> list[tuple[int, int]]:
        """(start, end) of the pieces kept, from (start, end, is_match) spans: tokenizers' SplitDelimiterBehavior."""
        behavior = self.behavior
        if behavior == "Isolated":
            return [(a, b) for a, b, _ in spans]
        if behavior == "Removed":
            return [(a, b) for a, b, is_match in spans if not is_match]
        out: list[list[int]] = []
        previous = False
        if behavior == "MergedWithNext":
            for a, b, is_match in reversed(spans):
                if is_match and not previous and out:
                    out[-1][0] = a
                else:
                    out.append([a, b])
                previous = is_match
            return [(a, b) for a, b in reversed(out)]
        for a, b, is_match in spans:
            merge = (is_match and not previous) if behavior == "MergedWithPrevious" else is_match == previous
            if merge and out:
                out[-1][1] = b
            else:
                out.append([a, b])
            previous = is_match
        return [(a, b) for a, b in out]


def _with_gaps(pattern: str) -> str:
    """A regex whose matches are `pattern`'s matches and, as pieces of their own, the text between them."""
    return f"(?:{pattern})|(?:(?!(?:{pattern}))(?s:.))+"


WHOLE_PIECE = r"(?s:.+)"  # the final regex when every split was made before tiktoken: each piece is one pre-token


def pre_tokenizer(spec: Optional[dict]) -> tuple[list[SplitStep], str]:
    """(steps run before tiktoken, tiktoken's regex): ByteLevel alone, or Split steps followed by ByteLevel."""
    kind = (spec or {}).get("type")
    steps = spec.get("pretokenizers", []) if kind == "Sequence" else [spec or {}]
    kinds = [p.get("type") for p in steps]
    if not kinds or kinds[-1] != "ByteLevel" or any(k != "Split" for k in kinds[:-1]):
        what = f"Sequence {kinds}" if kind == "Sequence" else kind
        raise Unsupported(f"pre-tokenizer {what} is not supported (only ByteLevel, after any number of Split steps)")
    byte_level, splits = steps[-1], steps[:-1]
    if byte_level.get("add_prefix_space"):
        raise Unsupported("pre-tokenizer ByteLevel with add_prefix_space is not supported")
    python_steps = [SplitStep(s) for s in splits]
    if byte_level.get("use_regex", True):
        return python_steps, GPT2_PATTERN  # GPT-2's regex leaves no text between its matches
    if not python_steps:
        return [], WHOLE_PIECE
    last, source = python_steps[-1], _pattern_source(splits[-1], for_rust=True)
    if last.behavior == "Isolated" and not last.invert:
        return python_steps[:-1], _with_gaps(source)
    if last.behavior == "Removed" and last.invert:
        return python_steps[:-1], source  # the matches only: what tiktoken's regex keeps
    return python_steps, WHOLE_PIECE
