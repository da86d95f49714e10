"""Tokenizers loaded from local files only: HF `tokenizer.json`, GPT-2 `vocab.json`+`merges.txt`, SentencePiece.

The returned object also satisfies what Megatron-Core's GPTDataset reads from a tokenizer
(`vocab_size`, `eod`, `pad`, `unique_identifiers`), so it can be passed to it directly.
"""

from __future__ import annotations

import abc
import json
import os
from typing import Callable, Optional, Sequence

from data_prep.checksums import sha256_files
from pretrain.faults import one_line

# Names tried, in order, for the end-of-document and padding tokens.
EOD_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<｜end▁of▁sentence｜>", "<eos>", "<eod>", "[SEP]")
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

    backend = "tokenizers"  # the library that encodes
    fallback_reason = ""  # why a faster encoder is not used ("" when none was tried or it is used)

    def check_fast_path(self, texts: list[str]) -> Optional[str]:
        """Check a fast encoder against the reference on `texts` (drop it on a difference); None when exact."""
        return None

    def describe_encoder(self) -> str:
        """One line: which encoder runs."""
        return f"encoder: {self.backend}"

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
    """A `tokenizers` Tokenizer (tokenizer.json, or GPT-2 vocab.json + merges.txt), encoded by FastBPE where exact.

    `special_tokens`: "text" (default) encodes a special token's string found in a document as plain
    text, as Megatron-LM's preprocess_data.py does with GPT-2 BPE; "honour" encodes it as the special id.
    """

    def __init__(self, tok, kind: str, path: str, files: list[str], eod_token: Optional[str],
                 special_tokens: str = "text") -> None:
        from data_prep.bpe_fast import SPECIAL_TOKEN_MODES

        if special_tokens not in SPECIAL_TOKEN_MODES:
            raise ValueError(f"special tokens {special_tokens!r}: want one of {', '.join(SPECIAL_TOKEN_MODES)}")
        self._tok, self.kind, self.path, self.files = tok, kind, path, files
        self.special_tokens = special_tokens
        tok.encode_special_tokens = special_tokens == "text"
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)
        self.eod = _find_token(tok.token_to_id, eod_token, EOD_CANDIDATES, path, "end-of-document")
        pad = _find_token(tok.token_to_id, None, PAD_CANDIDATES, path, "padding", required=False)
        self.pad = self.eod if pad is None else pad
        self._fast, self.fallback_reason = _fast_encoder(self._spec, special_tokens, path)

    def _spec(self) -> dict:
        """The tokenizer.json content the fast encoder is derived from."""
        if self.kind == "gpt2_bpe":
            return _gpt2_spec(self.files[0], self.files[1])
        with open(self.files[0], encoding="utf-8") as fh:
            return json.load(fh)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        fast = self._fast
        if fast is not None:
            return [fast.encode(t) for t in texts]  # no thread pool: one worker = one core
        return self._reference_batch(texts)

    def _reference_batch(self, texts: list[str]) -> list[list[int]]:
        # encode_batch_fast (tokenizers >= 0.20) skips offset tracking; ids are the same.
        enc = getattr(self._tok, "encode_batch_fast", None) or self._tok.encode_batch
        return [e.ids for e in enc(texts, add_special_tokens=False)]

    def check_fast_path(self, texts: list[str]) -> Optional[str]:
        """Encode `texts` with both encoders; on the first differing id drop the fast one. Returns the reason, if any."""
        if self._fast is None:
            return None
        from data_prep.bpe_fast import first_difference

        for k, (text, want) in enumerate(zip(texts, self._reference_batch(texts))):
            got = self._fast.encode(text)
            if got != want:
                j = first_difference(got, want)
                self._fast = None
                self.fallback_reason = (f"the fast encoder differs from tokenizers on sampled document {k} at token "
                                        f"{j} of {len(want)}")
                return self.fallback_reason
        return None

    @property
    def fast(self):
        """The FastBPE encoder in use, or None when `tokenizers` encodes."""
        return self._fast

    @property
    def backend(self) -> str:
        """Which library encodes: 'tiktoken' (the exact fast BPE path) or 'tokenizers'."""
        return "tiktoken" if self._fast is not None else "tokenizers"

    def describe_encoder(self) -> str:
        """One line: which encoder runs and, for the slow path, why."""
        if self._fast is not None:
            return "encoder: fast BPE (tiktoken), exact to tokenizers"
        return f"encoder: tokenizers (fast path not used: {self.fallback_reason})"

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def __getstate__(self):  # Rust objects pickle via JSON; keep it explicit for worker processes
        d = self.__dict__.copy()
        d["_tok"] = self._tok.to_str()
        d["_fast"] = self._fast is not None  # rebuilt from the files on the other side
        return d

    def __setstate__(self, d):
        from tokenizers import Tokenizer as RustTokenizer

        d["_tok"] = RustTokenizer.from_str(d["_tok"])
        d["_tok"].encode_special_tokens = d["special_tokens"] == "text"
        use_fast = d.pop("_fast")
        self.__dict__.update(d)
        self._fast = _fast_encoder(self._spec, self.special_tokens, self.path)[0] if use_fast else None

    def __repr__(self) -> str:
        return super().__repr__()[:-1] + f", special_tokens={self.special_tokens!r}; {self.describe_encoder()})"


class SentencePieceTokenizer(Tokenizer):
    """A SentencePiece `.model`."""

    kind = "sentencepiece"
    backend = "sentencepiece"

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


def load_tokenizer(path: str, eod_token: Optional[str] = None, special_tokens: str = "text") -> Tokenizer:
    """Load a tokenizer from a tokenizer.json, a .model, or a directory holding either or vocab.json+merges.txt.

    `special_tokens` ("text" or "honour") applies to tokenizer.json's special added tokens; GPT-2
    vocab/merges have none and SentencePiece models encode control symbols' strings as text anyway.
    """
    path = os.path.abspath(path)
    if os.path.isdir(path):
        for name in ("tokenizer.json",):
            if os.path.exists(os.path.join(path, name)):
                return load_tokenizer(os.path.join(path, name), eod_token, special_tokens)
        vocab, merges = os.path.join(path, "vocab.json"), os.path.join(path, "merges.txt")
        if os.path.exists(vocab) and os.path.exists(merges):
            return _load_gpt2_bpe(path, vocab, merges, eod_token, special_tokens)
        models = sorted(f for f in os.listdir(path) if f.endswith(".model"))
        if models:
            return SentencePieceTokenizer(os.path.join(path, models[0]), eod_token)
        raise FileNotFoundError(f"{path}: no tokenizer.json, vocab.json+merges.txt or *.model found")
    if not os.path.exists(path):
        raise FileNotFoundError(f"tokenizer not found: {path}")
    if path.endswith(".json") and os.path.basename(path) == "vocab.json":
        return load_tokenizer(os.path.dirname(path), eod_token, special_tokens)
    if path.endswith(".json"):
        from tokenizers import Tokenizer as RustTokenizer

        try:
            rust = RustTokenizer.from_file(path)
        except Exception as e:  # the Rust side raises a bare Exception for every parse error
            raise ValueError(f"{path}: malformed tokenizer.json ({one_line(str(e))}); fix: re-save it with "
                             "tokenizers' Tokenizer.save() or transformers' save_pretrained()") from None
        return HFTokenizer(rust, "hf", path, [path], eod_token, special_tokens)
    if path.endswith(".model"):
        return SentencePieceTokenizer(path, eod_token)
    raise ValueError(f"{path}: unrecognised tokenizer file (want tokenizer.json, vocab.json+merges.txt or .model)")


def _load_gpt2_bpe(path: str, vocab: str, merges: str, eod_token: Optional[str],
                   special_tokens: str = "text") -> HFTokenizer:
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
    return HFTokenizer(tok, "gpt2_bpe", path, [vocab, merges], eod_token, special_tokens)


BACKEND_ENV = "DATA_PREP_TOKENIZER_BACKEND"  # auto (default) | tokenizers | tiktoken


def _fast_encoder(spec: Callable[[], dict], special_tokens: str, where: str):
    """(FastBPE, "") when the fast encoder reproduces this BPE, else (None, the reason it is not used).

    DATA_PREP_TOKENIZER_BACKEND=tokenizers turns the fast path off; =tiktoken makes its refusal an error.
    """
    choice = os.environ.get(BACKEND_ENV, "auto").lower()
    if choice in ("tokenizers", "hf"):
        return None, f"{BACKEND_ENV}={choice}"
    try:
        import tiktoken  # noqa: F401
    except ImportError:
        if choice == "tiktoken":
            raise ImportError(f"{BACKEND_ENV}=tiktoken but tiktoken is not installed") from None
        return None, "tiktoken is not installed"
    from data_prep.bpe_fast import FastBPE, Unsupported

    try:
        return FastBPE(spec(), special_tokens), ""
    except Unsupported as e:
        if choice == "tiktoken":
            raise ValueError(f"{where}: the fast encoder cannot reproduce this BPE exactly: {e}") from None
        return None, str(e)


def _gpt2_spec(vocab: str, merges: str) -> dict:
    """vocab.json + merges.txt as the tokenizer.json that `_load_gpt2_bpe` assembles."""
    with open(vocab, encoding="utf-8") as fh:
        tokens = json.load(fh)
    with open(merges, encoding="utf-8") as fh:
        pairs = [line.rstrip("\r\n") for line in fh if not line.startswith("#version") and line.strip()]
    return {"model": {"type": "BPE", "vocab": tokens, "merges": pairs}, "normalizer": None,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
            "decoder": {"type": "ByteLevel"}, "added_tokens": []}
