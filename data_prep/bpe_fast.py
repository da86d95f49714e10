"""A fast exact encoder derived from a byte-level BPE `tokenizer.json` (GPT-2, GPT-NeoX/Pythia/OLMo, Llama-3, Qwen2, DeepSeek-V3).

HF `tokenizers` encodes a document as: split out added tokens matched on the raw text
(`normalized: false`), normalise each remaining piece, split out added tokens matched on the
normalised text, pre-tokenise each gap with a regex, byte-map each piece and apply the BPE
merges. tiktoken does the last two steps ~4x faster (no offsets, no per-piece allocations):
it merges, in each piece, the adjacent pair whose concatenation has the lowest rank, and emits
a piece that is a token as a whole. That equals the merge-list BPE when ranks follow the merge
order, so ranks are the token ids when merges are listed in id order (as in every file the
`tokenizers` trainer writes, GPT-NeoX-20B's included) and the merge index otherwise (then a
table maps ranks back to ids). The added-token splitting and the normalisation are done here,
as `tokenizers` does them. Whatever this module cannot reproduce raises `Unsupported` with the
reason; the caller then encodes with `tokenizers` and says why. Exactness is also checked on a
sample of each build's input (`sample_texts`, HFTokenizer.check_fast_path) before it is used.

A vocabulary may lack the byte tokens of bytes no UTF-8 text contains (GPT-NeoX-20B's, and so
Pythia's and OLMo-1's, lacks all 13): the encoder only ever sees decoded text. A pre-tokenizer
`Sequence` of `Split` steps followed by `ByteLevel` is run as `tokenizers` runs it: each step
splits every piece the previous one left; all steps but the last run here with the `regex`
module, the last one inside tiktoken (its regex, plus an alternative for the text between
matches, which `Split` keeps and tiktoken would drop).
"""

from __future__ import annotations

import re
import unicodedata
from typing import Iterable, Optional

# GPT-2's pre-tokenisation pattern: the one `tokenizers`' ByteLevel pre-tokenizer (use_regex), tiktoken's
# "gpt2" encoding and Megatron's GPT2BPETokenizer all use.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
NORMALIZERS = ("NFC", "NFD", "NFKC", "NFKD")  # the ones Python's unicodedata computes the same way
SPECIAL_TOKEN_MODES = ("text", "honour")  # special-token strings in documents: plain text, or the special id
# Bytes no UTF-8 text contains: 0xC0/0xC1 could only start overlong forms, 0xF5-0xFF code points above U+10FFFF.
NON_UTF8_BYTES = frozenset([0xC0, 0xC1, *range(0xF5, 0x100)])
SPLIT_BEHAVIORS = ("Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous")


class Unsupported(ValueError):
    """The tokenizer.json uses something the fast encoder does not reproduce (the message says what)."""


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map (the alphabet of byte-level vocabularies)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def bpe_ranks(vocab: dict[str, int], merges: Iterable[tuple[str, str]]) -> tuple[dict[bytes, int], Optional[list[int]]]:
    """tiktoken ranks for a byte-level vocab + merge list, and the rank -> id table (None when ranks are ids).

    Vocab entries that no merge produces are left out: the merge-list BPE never outputs them either.
    """
    b2u = bytes_to_unicode()
    u2b = {c: b for b, c in b2u.items()}
    missing = [b for b, c in b2u.items() if c not in vocab]
    needed = [b for b in missing if b not in NON_UTF8_BYTES]
    if needed:
        raise Unsupported(f"{len(missing)} of the 256 byte tokens are missing from the vocab, {len(needed)} of them "
                          f"for bytes UTF-8 text uses (e.g. byte 0x{needed[0]:02X}, token {b2u[needed[0]]!r})")

    def to_bytes(token: str) -> bytes:
        try:
            return bytes(u2b[c] for c in token)
        except KeyError:
            raise Unsupported(f"token {token!r} has characters outside the byte-level alphabet") from None

    singles = {bytes([b]): vocab[c] for b, c in b2u.items() if c in vocab}
    results: list[tuple[bytes, int]] = []
    seen: set[bytes] = set(singles)
    for a, b in merges:
        if a not in vocab or b not in vocab or a + b not in vocab:
            raise Unsupported(f"merge {a!r} {b!r} involves a token not in the vocab")
        merged = to_bytes(a + b)
        if merged in seen:
            raise Unsupported(f"token {a + b!r} is produced by two merges")
        seen.add(merged)
        results.append((merged, vocab[a + b]))
    ids = [i for _, i in results]
    if all(x < y for x, y in zip(ids, ids[1:])):
        return {**singles, **dict(results)}, None
    # Out of id order: rank = merge index (bytes first, never compared as merges), mapped back to ids.
    order = sorted(singles)
    ranks = {b: r for r, b in enumerate(order)}
    ranks.update((b, len(order) + k) for k, (b, _) in enumerate(results))
    table = [singles[b] for b in order] + ids
    return ranks, table


def _merge_pairs(raw: list) -> list[tuple[str, str]]:
    """Merges as (left, right): tokenizers writes "a b" strings (old files) or [a, b] pairs (>= 0.20)."""
    out = []
    for m in raw:
        parts = m.split(" ") if isinstance(m, str) else list(m)
        if len(parts) != 2:
            raise Unsupported(f"unreadable merge {m!r}")
        out.append((parts[0], parts[1]))
    return out


def _normalizer(spec: Optional[dict]) -> Optional[str]:
    if spec is None:
        return None
    kind = spec.get("type")
    if kind == "Sequence":
        inner = spec.get("normalizers", [])
        if not inner:
            return None
        if len(inner) == 1:
            return _normalizer(inner[0])
        raise Unsupported(f"normalizer Sequence of {[n.get('type') for n in inner]} is not supported")
    if kind in NORMALIZERS:
        return kind
    raise Unsupported(f"normalizer {kind} is not supported (only {', '.join(NORMALIZERS)})")


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


def _pre_tokenizer(spec: Optional[dict]) -> tuple[list[SplitStep], str]:
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


def _splitter(tokens: dict[str, int]) -> Optional[re.Pattern]:
    """A regex splitting out `tokens` leftmost-longest, as `tokenizers`' Aho-Corasick matcher does.

    Written as a trie (a common prefix is tried once; a longer token before its prefix), so a
    file with a thousand added tokens costs little more than one with a few.
    """
    if not tokens:
        return None
    trie: dict = {}
    for token in tokens:
        node = trie
        for c in token:
            node = node.setdefault(c, {})
        node[""] = True

    def alternation(node: dict) -> str:
        branches = [re.escape(c) + alternation(child) for c, child in sorted(node.items()) if c]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        return f"(?:{body})?" if "" in node else body

    return re.compile("(" + alternation(trie) + ")")


def _whitespace_tokens_in_pattern(tokens: dict[str, int]) -> str:
    """GPT-2's regex with whitespace-only added tokens as pieces of their own (then tiktoken emits their ids).

    `tokenizers` splits the added tokens out (leftmost-longest) before the regex runs on the gaps.
    Same pieces in one pass (~13% faster than splitting in Python): GPT-2's other alternatives take
    at most one leading whitespace character followed by a non-space, so none matches where a token
    of >= 2 whitespace characters starts; then the added tokens (longest first); then GPT-2's
    whitespace alternatives, consuming only characters where no added token starts. No other piece
    contains an added token's text, so no BPE merge can produce one.
    """
    def esc(t: str) -> str:
        return t.replace("\t", r"\t").replace("\n", r"\n").replace("\r", r"\r")

    ordered = sorted(tokens, key=lambda t: (-len(t), t))
    alt = "|".join(map(esc, ordered))
    starts = "|".join(esc(t) for t in ordered if not any(u != t and t.startswith(u) for u in ordered))
    ws = f"(?:(?!{starts})\\s)+"
    assert GPT2_PATTERN.endswith(r"|\s+(?!\S)|\s+")
    return GPT2_PATTERN[: -len(r"|\s+(?!\S)|\s+")] + f"|{alt}|{ws}(?!\\S)|{ws}"


class FastBPE:
    """Encodes text exactly as `tokenizers` does with one byte-level BPE tokenizer.json (add_special_tokens=False)."""

    def __init__(self, spec: dict, special_tokens: str = "text") -> None:
        import tiktoken

        if special_tokens not in SPECIAL_TOKEN_MODES:
            raise ValueError(f"special_tokens={special_tokens!r}: want one of {SPECIAL_TOKEN_MODES}")
        model = spec.get("model") or {}
        if model.get("type") != "BPE":
            raise Unsupported(f"model {model.get('type')} is not BPE")
        for key in ("dropout", "continuing_subword_prefix", "end_of_word_suffix"):
            if model.get(key):
                raise Unsupported(f"BPE with {key}={model[key]!r} is not supported")
        if model.get("byte_fallback"):
            raise Unsupported("BPE with byte_fallback is not byte-level BPE")
        if (spec.get("decoder") or {}).get("type") != "ByteLevel":
            raise Unsupported(f"decoder {(spec.get('decoder') or {}).get('type')} is not ByteLevel")
        self.normalizer = _normalizer(spec.get("normalizer"))
        self._steps, pat_str = _pre_tokenizer(spec.get("pre_tokenizer"))
        vocab = model.get("vocab") or {}
        ranks, self._table = bpe_ranks(vocab, _merge_pairs(model.get("merges") or []))
        added_ids = {t["id"] for t in spec.get("added_tokens", [])}
        if model.get("ignore_merges"):
            # tokenizers emits any vocab entry that is a whole pre-token; tiktoken only those in its ranks.
            u2b = {c: b for b, c in bytes_to_unicode().items()}
            extra = [t for t, i in vocab.items() if i not in added_ids
                     and (not all(c in u2b for c in t) or bytes(u2b[c] for c in t) not in ranks)]
            if extra:
                raise Unsupported(f"ignore_merges with {len(extra)} vocab entries no merge produces "
                                  f"(e.g. {extra[0]!r})")
        raw, norm = {}, {}
        for t in spec.get("added_tokens", []):
            if t.get("special") and special_tokens == "text":
                continue  # kept as plain text, as Megatron-LM's preprocess_data.py does with GPT-2 BPE
            if t.get("lstrip") or t.get("rstrip") or t.get("single_word"):
                raise Unsupported(f"added token {t['content']!r} with lstrip/rstrip/single_word is not supported")
            content = t["content"]
            if t.get("normalized"):
                norm[self._normalize(content)] = t["id"]
            else:
                raw[content] = t["id"]
        if set(raw) & set(norm):
            raise Unsupported("an added token is both normalised and not")
        if self._table is not None:  # encode() maps ranks to ids; added tokens' ids are marked to pass through
            raw, norm = ({t: -1 - i for t, i in d.items()} for d in (raw, norm))
        if pat_str == GPT2_PATTERN and not self._steps and self._table is None and norm \
                and all(len(t) >= 2 and set(t) <= set(" \t\r\n") for t in norm):
            pat_str = _whitespace_tokens_in_pattern(norm)
            ranks.update((t.encode(), i) for t, i in norm.items())  # a merge result with the same text is unreachable
            norm = {}
        self._raw_re, self._raw_ids = _splitter(raw), raw
        self._norm_re, self._norm_ids = _splitter(norm), norm
        try:
            self._enc = tiktoken.Encoding("data_prep_fast_bpe", pat_str=pat_str, mergeable_ranks=ranks,
                                          special_tokens={})
            self._enc.encode_ordinary("probe: the regex compiles")
        except Exception as e:  # tiktoken's Rust regex raises its own error types
            raise Unsupported(f"pre-tokenizer regex not accepted by tiktoken ({str(e).splitlines()[0]})") from None
        self._bpe = self._enc.encode_ordinary if not self._steps else self._encode_pieces
        self._piece_ids: dict[str, list[int]] = {}  # short pieces seen before (digit groups, words) -> ids
        self.special_tokens = special_tokens

    @property
    def ranks_are_ids(self) -> bool:
        """True when merges are in id order (ranks are the ids); False when a table maps merge ranks to ids."""
        return self._table is None

    def _normalize(self, text: str) -> str:
        return unicodedata.normalize(self.normalizer, text) if self.normalizer else text

    def _encode_pieces(self, text: str) -> list[int]:
        """Run the Split steps before tiktoken in order, each on every piece the last left; BPE each piece."""
        pieces = [text]
        for step in self._steps:
            pieces = [p for piece in pieces for p in step.split(piece)]
        cache, enc, out = self._piece_ids, self._enc.encode_ordinary, []
        for piece in pieces:
            ids = cache.get(piece)
            if ids is None:
                ids = enc(piece)
                if len(piece) <= 32:
                    if len(cache) >= 200_000:
                        cache.clear()
                    cache[piece] = ids
            out += ids
        return out

    def _encode_gap(self, text: str) -> list[int]:
        """Normalise, split out normalised added tokens, BPE the rest."""
        text = self._normalize(text)
        if self._norm_re is None:
            return self._bpe(text)
        parts = self._norm_re.split(text)
        enc, ids_of = self._bpe, self._norm_ids
        out = enc(parts[0]) if parts[0] else []
        for i in range(1, len(parts), 2):
            out.append(ids_of[parts[i]])
            if parts[i + 1]:
                out.extend(enc(parts[i + 1]))
        return out

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` (no special tokens added)."""
        if self._raw_re is None:
            out = self._encode_gap(text)
        else:
            parts = self._raw_re.split(text)
            out = self._encode_gap(parts[0]) if parts[0] else []
            for i in range(1, len(parts), 2):
                out.append(self._raw_ids[parts[i]])
                if parts[i + 1]:
                    out.extend(self._encode_gap(parts[i + 1]))
        table = self._table
        if table is None:
            return out
        return [table[i] if i >= 0 else -1 - i for i in out]  # added tokens carry their id, marked negative


def sample_texts(units: list, max_bytes: int = 512 << 10, per_unit: int = 64 << 10) -> list[str]:
    """Documents (as tokenised: after the build's normalisation) from up to 8 units spread over the input."""
    from data_prep.readers import iter_unit

    step = max(1, len(units) // 8)
    texts: list[str] = []
    total = 0
    for unit in units[::step][:8]:
        taken = 0
        for record in iter_unit(unit):
            if record.skip_reason is not None:
                continue
            text = record.text[:per_unit]
            texts.append(text)
            taken += len(text)
            total += len(text)
            if taken >= per_unit or total >= max_bytes:
                break
        if total >= max_bytes:
            break
    return texts


def first_difference(a: list[int], b: list[int]) -> int:
    """Index of the first position where two id lists differ (len of the shorter if one is a prefix)."""
    for k, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return k
    return min(len(a), len(b))
