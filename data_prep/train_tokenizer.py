"""`train-tokenizer`: train SentencePiece (BPE/unigram) or a byte-level BPE on a sample of the corpus."""

from __future__ import annotations

import os
from typing import Iterator

from data_prep.readers import iter_unit
from data_prep.units import plan_units

KINDS = ("sentencepiece-bpe", "sentencepiece-unigram", "bytelevel-bpe")


def sample_texts(inputs: list[str], sample_bytes: int, fmt: str = "auto", jsonl_key: str = "text") -> Iterator[str]:
    """Normalised documents from the start of the corpus (in unit order) up to ~sample_bytes."""
    seen = 0
    for unit in plan_units(inputs, fmt, jsonl_key):
        for rec in iter_unit(unit):
            if rec.text is None:
                continue
            yield rec.text
            seen += len(rec.text.encode("utf-8"))
            if seen >= sample_bytes:
                return


def train_tokenizer(inputs: list[str], output: str, kind: str, vocab_size: int, sample_bytes: int = 100_000_000,
                    fmt: str = "auto", jsonl_key: str = "text") -> str:
    """Train and save a tokenizer into `output`; returns the path to pass to `build --tokenizer`."""
    if kind not in KINDS:
        raise ValueError(f"unknown tokenizer kind {kind!r}; choose from {KINDS}")
    os.makedirs(output, exist_ok=True)
    texts = sample_texts(inputs, sample_bytes, fmt, jsonl_key)
    if kind == "bytelevel-bpe":
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|padding|>"],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
        tok.train_from_iterator(texts, trainer=trainer)
        path = os.path.join(output, "tokenizer.json")
        tok.save(path)
        return path

    import sentencepiece as spm

    def lines() -> Iterator[str]:
        # SentencePiece trains on sentences; give it the document's lines.
        for t in texts:
            for line in t.split("\n"):
                if line.strip():
                    yield line

    prefix = os.path.join(output, "tokenizer")
    spm.SentencePieceTrainer.train(
        sentence_iterator=lines(), model_prefix=prefix, vocab_size=vocab_size,
        model_type="bpe" if kind == "sentencepiece-bpe" else "unigram",
        # Lossless: keep text exactly (no NFKC, no whitespace squashing), bytes for unseen characters.
        normalization_rule_name="identity", remove_extra_whitespaces=False, byte_fallback=True,
        split_digits=True, allow_whitespace_only_pieces=True, character_coverage=0.9995,
        user_defined_symbols=["\n"], unk_id=0, bos_id=1, eos_id=2, pad_id=3,
        hard_vocab_limit=False, num_threads=1, minloglevel=2,
    )
    return prefix + ".model"
