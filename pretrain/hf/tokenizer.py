"""Tokenizer files for Hugging Face: our data_prep tokenizers (SentencePiece, tokenizer.json,
GPT-2 vocab+merges) as a `PreTrainedTokenizerFast`, and verbatim copies of an HF directory's files.
"""

from __future__ import annotations

import shutil
from pathlib import Path

# `tokenizer._tok` below is data_prep's own HFTokenizer's `tokenizers.Tokenizer` (this project's
# code, not a library's): its JSON is the exact tokenizer, GPT-2 vocab+merges already assembled.

# The files transformers' tokenizers read (an import keeps them, an export of that run ships them
# unchanged, so a round trip encodes bit for bit like the original).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "tokenizer.model", "spiece.model", "vocab.json", "merges.txt", "vocab.txt",
                   "chat_template.jinja", "chat_template.json")


def copy_tokenizer_files(source: str | Path, target: str | Path) -> list[str]:
    """Copy the TOKENIZER_FILES present in `source` to `target` byte for byte; returns their names."""
    source, target = Path(source), Path(target)
    names = [n for n in TOKENIZER_FILES if (source / n).is_file()]
    if names:
        target.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copyfile(source / name, target / name)
    return names


def _bpe_merges(vocab: dict[str, int], vocab_scores: list[tuple[str, float]], skip: set[str]) -> list[tuple[str, str]]:
    """BPE merges that rebuild each SentencePiece piece from two pieces, highest score first.

    Same order as transformers 5's `generate_merges(..., skip_tokens=...)` (score, then longer
    left and right parts, then piece id and part ids); written here because 4.x lacks skip_tokens.
    """
    ranked = []
    for index, (piece, score) in enumerate(vocab_scores):
        if piece in skip:
            continue  # control pieces (</s>, ...) never come out of a merge
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab and left not in skip and right not in skip:
                ranked.append(((-score, -len(left), -len(right), index, vocab[left], vocab[right]), (left, right)))
    return [pair for _, pair in sorted(ranked)]


def sentencepiece_to_tokenizers(model_file: str):
    """A `tokenizers.Tokenizer` that encodes like the SentencePiece `.model` (BPE or unigram)."""
    from sentencepiece import sentencepiece_model_pb2
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers
    from tokenizers.models import BPE, Unigram

    proto = sentencepiece_model_pb2.ModelProto()
    with open(model_file, "rb") as fh:
        proto.ParseFromString(fh.read())
    trainer, norm = proto.trainer_spec, proto.normalizer_spec
    vocab_scores = [(p.piece, p.score) for p in proto.pieces]
    control = {p.piece for p in proto.pieces if p.type == 3}
    if trainer.model_type == 1:  # unigram
        # SentencePiece never lets control pieces (</s>, ...) match text; HF's lattice would.
        floor = min(score for _, score in vocab_scores) - 1e6
        lattice = [(piece, floor if piece in control else score) for piece, score in vocab_scores]
        tok = Tokenizer(Unigram(lattice, unk_id=trainer.unk_id, byte_fallback=trainer.byte_fallback))
    elif trainer.model_type == 2:  # bpe: SentencePiece merges the highest-scoring pair first
        vocab = {piece: i for i, (piece, _) in enumerate(vocab_scores)}
        merges = _bpe_merges(vocab, vocab_scores, skip=control)
        tok = Tokenizer(BPE(vocab, merges, unk_token=trainer.unk_piece, fuse_unk=True,
                            byte_fallback=trainer.byte_fallback, dropout=None))
    else:
        raise ValueError(f"{model_file}: SentencePiece model_type {trainer.model_type} is not BPE or unigram")
    steps = []
    if norm.precompiled_charsmap:
        steps.append(normalizers.Precompiled(norm.precompiled_charsmap))
    if norm.remove_extra_whitespaces:
        steps += [normalizers.Strip(left=True, right=True), normalizers.Replace(Regex(" {2,}"), " ")]
    # SentencePiece adds its dummy prefix even before a leading space; Metaspace would not.
    if norm.add_dummy_prefix:
        steps.append(normalizers.Prepend("▁"))
    steps.append(normalizers.Replace(" ", "▁"))
    tok.normalizer = normalizers.Sequence(steps)
    decode = [decoders.Replace("▁", " ")]
    if trainer.byte_fallback:
        decode += [decoders.ByteFallback()]
    decode += [decoders.Fuse()]
    if norm.add_dummy_prefix:
        decode += [decoders.Strip(content=" ", left=1, right=0)]
    tok.decoder = decoders.Sequence(decode)
    # Control pieces (<s>, </s>, <pad>) become special tokens. User-defined pieces (e.g. "\n")
    # stay plain vocabulary: as added tokens they would split the text and the normalizer
    # would then add a dummy prefix after each one, which SentencePiece does not.
    tok.add_special_tokens([AddedToken(p.piece, normalized=False, special=True)
                            for p in proto.pieces if p.type == 3])
    return tok


def _special_pieces(tokenizer) -> dict[str, str | None]:
    """bos/eos/pad/unk pieces of a data_prep Tokenizer (GPT-2 convention: eos doubles as bos)."""
    if tokenizer.kind == "sentencepiece":
        import sentencepiece as spm

        sp = spm.SentencePieceProcessor(model_file=tokenizer.path)
        eos = sp.id_to_piece(tokenizer.eod)
        return {"bos": sp.id_to_piece(sp.bos_id()) if sp.bos_id() >= 0 else eos, "eos": eos,
                "pad": sp.id_to_piece(tokenizer.pad), "unk": sp.id_to_piece(sp.unk_id()) if sp.unk_id() >= 0 else None}
    from tokenizers import Tokenizer as RustTokenizer

    rust = RustTokenizer.from_str(tokenizer._tok.to_str())
    eos = rust.id_to_token(tokenizer.eod)
    return {"bos": eos, "eos": eos, "pad": rust.id_to_token(tokenizer.pad), "unk": None}


def special_token_ids(tokenizer) -> dict[str, int]:
    """config.json's bos/eos/pad ids for a data_prep Tokenizer."""
    ids = {"eos_token_id": tokenizer.eod, "pad_token_id": tokenizer.pad}
    if tokenizer.kind == "sentencepiece":
        import sentencepiece as spm

        bos = spm.SentencePieceProcessor(model_file=tokenizer.path).bos_id()
        ids["bos_token_id"] = bos if bos >= 0 else tokenizer.eod
    else:
        ids["bos_token_id"] = tokenizer.eod  # GPT-2 convention
    return ids


def hf_tokenizer(tokenizer):
    """A `PreTrainedTokenizerFast` equivalent to our data_prep Tokenizer (hf, gpt2_bpe or sentencepiece)."""
    from tokenizers import Tokenizer as RustTokenizer
    from transformers import PreTrainedTokenizerFast

    if tokenizer.kind == "sentencepiece":
        rust = sentencepiece_to_tokenizers(tokenizer.path)
    else:
        rust = RustTokenizer.from_str(tokenizer._tok.to_str())
    pieces = _special_pieces(tokenizer)
    # Our encoder adds no special tokens; no post-processor keeps HF the same.
    # The export encodes text as the shards were built: a literal "</s>" / "<|endoftext|>" in text is
    # characters unless the build honoured special tokens (data_prep --special-tokens honour).
    as_text = getattr(tokenizer, "special_tokens", "text") == "text"
    return PreTrainedTokenizerFast(tokenizer_object=rust, bos_token=pieces["bos"], eos_token=pieces["eos"],
                                   pad_token=pieces["pad"], unk_token=pieces["unk"],
                                   clean_up_tokenization_spaces=False, split_special_tokens=as_text)
