"""Tokenizers loaded from local files only: HF `tokenizer.json`, GPT-2 `vocab.json`+`merges.txt`, SentencePiece.

The returned object also satisfies what Megatron-Core's GPTDataset reads from a tokenizer
(`vocab_size`, `eod`, `pad`, `unique_identifiers`), so it can be passed to it directly.
"""

from __future__ import annotations

import abc
import json
import os
from typing import Optional, Sequence

from data_prep.checksums import sha256_files
from data_prep.errors import one_line

# Names tried, in order, for the end-of-document and padding tokens.
EOD_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<eod>", "[SEP]")
PAD_CANDIDATES = ("<|padding|>", "<pad>", "[PAD]", "<|pad|>")


class Tokenizer(abc.ABC):
    """Common interface over the three tokenizer kinds."""

    kind: str
    path: str
    files: list[str]
    vocab_size: int
    eod: int
    pad: int

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, without any special tokens added."""
        return self.encode_batch([text])[0]

    @abc.abstractmethod
    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids of several texts (implementations batch into native code)."""

    @abc.abstractmethod
    def decode(self, ids: Sequence[int]) -> str:
        """Text of token ids (special tokens kept)."""

    @property
    def sha256(self) -> str:
        """Hash of the tokenizer file(s), recorded in the manifest."""
        if not hasattr(self, "_sha"):
            self._sha = sha256_files(self.files)
        return self._sha

    @property
    def unique_identifiers(self) -> dict:
        """What Megatron's dataset cache keys use to tell tokenizers apart."""
        return {"class": "data_prep.Tokenizer", "kind": self.kind, "sha256": self.sha256}

    def __repr__(self) -> str:
        return f"Tokenizer(kind={self.kind!r}, path={self.path!r}, vocab_size={self.vocab_size}, eod={self.eod})"


class HFTokenizer(Tokenizer):
    """A `tokenizers` Tokenizer: from tokenizer.json, or assembled from GPT-2 vocab.json + merges.txt."""

    def __init__(self, tok, kind: str, path: str, files: list[str], eod_token: Optional[str]) -> None:
        self._tok, self.kind, self.path, self.files = tok, kind, path, files
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)
        self.eod = _find_token(tok.token_to_id, eod_token, EOD_CANDIDATES, path, "end-of-document")
        pad = _find_token(tok.token_to_id, None, PAD_CANDIDATES, path, "padding", required=False)
        self.pad = self.eod if pad is None else pad

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        fast = getattr(self, "_fast", None)
        if fast is not None:
            return [fast.encode_ordinary(t) for t in texts]  # no thread pool: one worker = one core
        # encode_batch_fast (tokenizers >= 0.20) skips offset tracking; ids are the same.
        enc = getattr(self._tok, "encode_batch_fast", None) or self._tok.encode_batch
        return [e.ids for e in enc(texts, add_special_tokens=False)]

    @property
    def backend(self) -> str:
        """Which library encodes: 'tiktoken' (GPT-2 BPE fast path) or 'tokenizers'."""
        return "tiktoken" if getattr(self, "_fast", None) is not None else "tokenizers"

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def __getstate__(self):  # Rust objects pickle via JSON; keep it explicit for worker processes
        d = self.__dict__.copy()
        d["_tok"] = self._tok.to_str()
        d.pop("_fast", None)  # rebuilt from the files on the other side
        return d

    def __setstate__(self, d):
        from tokenizers import Tokenizer as RustTokenizer

        d["_tok"] = RustTokenizer.from_str(d["_tok"])
        self.__dict__.update(d)
        if self.kind == "gpt2_bpe":
            self._fast = _tiktoken_gpt2(self.files[0], self.files[1])


class SentencePieceTokenizer(Tokenizer):
    """A SentencePiece `.model`."""

    kind = "sentencepiece"

    def __init__(self, path: str, eod_token: Optional[str]) -> None:
        import sentencepiece as spm

        self.path, self.files = path, [path]
        try:
            self._sp = spm.SentencePieceProcessor(model_file=path)
        except (RuntimeError, OSError) as e:
            raise ValueError(f"{path}: not a readable SentencePiece model ({one_line(str(e))}); fix: pass the "
                             ".model file written by spm_train or `data_prep train-tokenizer`") from None
        self.vocab_size = self._sp.get_piece_size()

        def lookup(tok: str) -> Optional[int]:
            i = self._sp.piece_to_id(tok)
            return None if i == self._sp.unk_id() and tok != self._sp.id_to_piece(i) else i

        if eod_token is None and self._sp.eos_id() >= 0:
            self.eod = self._sp.eos_id()
        else:
            self.eod = _find_token(lookup, eod_token, EOD_CANDIDATES, path, "end-of-document")
        self.pad = self._sp.pad_id() if self._sp.pad_id() >= 0 else self.eod

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return self._sp.encode(texts, num_threads=1)

    def decode(self, ids: Sequence[int]) -> str:
        return self._sp.decode([int(i) for i in ids])

    def __getstate__(self):
        d = self.__dict__.copy()
        d.pop("_sp")
        return d

    def __setstate__(self, d):
        import sentencepiece as spm

        self.__dict__.update(d)
        self._sp = spm.SentencePieceProcessor(model_file=self.path)


def _find_token(lookup, explicit: Optional[str], candidates: Sequence[str], path: str, what: str,
                required: bool = True) -> Optional[int]:
    names = [explicit] if explicit else list(candidates)
    for name in names:
        i = lookup(name)
        if i is not None:
            return int(i)
    if required:
        raise ValueError(f"{path}: no {what} token found (tried {names}); pass --eod-token")
    return None


def load_tokenizer(path: str, eod_token: Optional[str] = None) -> Tokenizer:
    """Load a tokenizer from a tokenizer.json, a .model, or a directory holding either or vocab.json+merges.txt."""
    path = os.path.abspath(path)
    if os.path.isdir(path):
        for name in ("tokenizer.json",):
            if os.path.exists(os.path.join(path, name)):
                return load_tokenizer(os.path.join(path, name), eod_token)
        vocab, merges = os.path.join(path, "vocab.json"), os.path.join(path, "merges.txt")
        if os.path.exists(vocab) and os.path.exists(merges):
            return _load_gpt2_bpe(path, vocab, merges, eod_token)
        models = sorted(f for f in os.listdir(path) if f.endswith(".model"))
        if models:
            return SentencePieceTokenizer(os.path.join(path, models[0]), eod_token)
        raise FileNotFoundError(f"{path}: no tokenizer.json, vocab.json+merges.txt or *.model found")
    if not os.path.exists(path):
        raise FileNotFoundError(f"tokenizer not found: {path}")
    if path.endswith(".json") and os.path.basename(path) == "vocab.json":
        return load_tokenizer(os.path.dirname(path), eod_token)
    if path.endswith(".json"):
        from tokenizers import Tokenizer as RustTokenizer

        try:
            rust = RustTokenizer.from_file(path)
        except Exception as e:  # the Rust side raises a bare Exception for every parse error
            raise ValueError(f"{path}: malformed tokenizer.json ({one_line(str(e))}); fix: re-save it with "
                             "tokenizers' Tokenizer.save() or transformers' save_pretrained()") from None
        return HFTokenizer(rust, "hf", path, [path], eod_token)
    if path.endswith(".model"):
        return SentencePieceTokenizer(path, eod_token)
    raise ValueError(f"{path}: unrecognised tokenizer file (want tokenizer.json, vocab.json+merges.txt or .model)")


def _load_gpt2_bpe(path: str, vocab: str, merges: str, eod_token: Optional[str]) -> HFTokenizer:
    """GPT-2 byte-level BPE, identical in output to GPT-2's own (and Megatron's GPT2BPETokenizer)."""
    from tokenizers import Tokenizer as RustTokenizer, decoders, models, pre_tokenizers

    try:
        with open(vocab, encoding="utf-8") as fh:
            if not isinstance(json.load(fh), dict):
                raise ValueError("not a JSON object")
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{vocab}: malformed vocab.json ({one_line(str(e))}); fix: it must be a JSON object "
                         "mapping each token to its id, as GPT-2's vocab.json or tokenizers' model.save() write it"
                         ) from None
    try:
        bpe = models.BPE.from_file(vocab, merges)
    except Exception as e:  # the Rust side raises a bare Exception for every parse error
        raise ValueError(f"{merges}: malformed merges file ({one_line(str(e))}); fix: after the '#version' line "
                         f"every line must be two space-separated tokens of {os.path.basename(vocab)}, as GPT-2's "
                         "merges.txt or tokenizers' model.save() write it") from None
    tok = RustTokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    # <|endoftext|> stays an ordinary vocab entry, as in GPT-2: a literal one in text is not an EOD.
    out = HFTokenizer(tok, "gpt2_bpe", path, [vocab, merges], eod_token)
    out._fast = _tiktoken_gpt2(vocab, merges)
    return out


# GPT-2's pre-tokenisation pattern: the one `tokenizers`' ByteLevel pre-tokenizer, tiktoken's
# "gpt2" encoding and Megatron's GPT2BPETokenizer all use.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
BACKEND_ENV = "DATA_PREP_TOKENIZER_BACKEND"  # auto (default) | tokenizers | tiktoken


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map (the alphabet of vocab.json)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def _tiktoken_gpt2(vocab: str, merges: str):
    """A tiktoken Encoding giving the same ids as the merge-list BPE, or None (then `tokenizers` encodes).

    tiktoken merges, at each step, the adjacent pair whose concatenation has the lowest id; the
    merge-list BPE merges the listed pair with the lowest merge index. They agree when the ids of
    merge results increase in merge order and only merge results (plus the 256 bytes) are mergeable,
    which is checked here; vocab entries no merge produces (e.g. <|endoftext|>) are left out, as the
    merge-list BPE can never output them either. tiktoken encodes ~6x faster (no offsets, no
    per-piece allocations). Set DATA_PREP_TOKENIZER_BACKEND=tokenizers to disable.
    """
    choice = os.environ.get(BACKEND_ENV, "auto").lower()
    if choice in ("tokenizers", "hf"):
        return None
    try:
        import tiktoken
    except ImportError:
        if choice == "tiktoken":
            raise ImportError(f"{BACKEND_ENV}=tiktoken but tiktoken is not installed") from None
        return None

    def refuse(why: str):
        if choice == "tiktoken":
            raise ValueError(f"{vocab}: tiktoken cannot reproduce this BPE exactly: {why}")
        return None

    u2b = {c: b for b, c in _bytes_to_unicode().items()}
    with open(vocab, encoding="utf-8") as fh:
        tokens = json.load(fh)
    try:
        byte_of = {t: bytes(u2b[c] for c in t) for t in tokens}
    except KeyError:
        return refuse("vocab has characters outside GPT-2's byte alphabet")
    ranks: dict[bytes, int] = {}
    for c in u2b:
        if c not in tokens:
            return refuse(f"byte character {c!r} missing from the vocab")
        ranks[byte_of[c]] = tokens[c]
    last = -1
    with open(merges, encoding="utf-8") as fh:
        for line in fh:
            if line.startswith("#version") or not line.strip():
                continue
            parts = line.rstrip("\r\n").split(" ")
            if len(parts) != 2:
                return refuse(f"unreadable merge line {line!r}")
            merged = parts[0] + parts[1]
            i = tokens.get(merged)
            if i is None or parts[0] not in tokens or parts[1] not in tokens:
                return refuse(f"merge {line.strip()!r} involves a token not in the vocab")
            if i <= last or byte_of[merged] in ranks:
                return refuse("merge results' ids do not increase in merge order")
            ranks[byte_of[merged]] = last = i
    return tiktoken.Encoding(f"data_prep_gpt2_{os.path.basename(os.path.dirname(os.path.abspath(vocab)))}",
                             pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={})
