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
Pythia's and OLMo-1's, lacks all 13): the encoder only ever sees decoded text. The pre-tokenizer
(`Split` steps, then `ByteLevel`) is read and run by bpe_pretokenizer.py.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Iterable, Optional

from data_prep.bpe_pretokenizer import GPT2_PATTERN, Unsupported, pre_tokenizer

NORMALIZERS = ("NFC", "NFD", "NFKC", "NFKD")  # the ones Python's unicodedata computes the same way
SPECIAL_TOKEN_MODES = ("text", "honour")  # special-token strings in documents: plain text, or the special id
# Bytes no UTF-8 text contains: 0xC0/0xC1 could only start overlong forms, 0xF5-0xFF code points above U+10FFFF.
NON_UTF8_BYTES = frozenset([0xC0, 0xC1, *range(0xF5, 0x100)])


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
        self._steps, pat_str = pre_tokenizer(spec.get("pre_tokenizer"))
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
