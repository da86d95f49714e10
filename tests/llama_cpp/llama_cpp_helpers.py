"""What the tests/llama_cpp modules share: their skip rule, tiny trained checkpoints, the tokenizers data_prep trains.

These modules run in `make test-llama-cpp` only (it installs llama-cpp-python and unpacks llama.cpp's converter,
then sets LLAMA_CPP_DIR); anywhere else each module is skipped with the reason, so `make test` pays nothing.
"""

import dataclasses
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))

WINDOW = 32  # the tiny preset's training window
MODEL_VOCAB = 512  # tiny_config's vocabulary; the trained tokenizers stay below it
TOKENIZER_VOCAB = 500


def require_llama_cpp() -> None:
    """Skip the calling module (with the reason) unless llama-cpp-python imports and LLAMA_CPP_DIR is set."""
    try:
        # the class, not the package: with tests/ on sys.path this directory imports as a namespace `llama_cpp`
        from llama_cpp import Llama  # noqa: F401
    except ImportError as error:
        pytest.skip(f"llama-cpp-python is not installed ({error}); run `make test-llama-cpp`", allow_module_level=True)
    if not os.environ.get("LLAMA_CPP_DIR"):
        pytest.skip("LLAMA_CPP_DIR (llama.cpp's converter) is not set; run `make test-llama-cpp`",
                    allow_module_level=True)


def train_tiny(run_dir, *, groups=2, untied=False, positions=None, **model_options):
    """A tiny checkpoint trained 2 steps (synthetic tokens) with the given model options; returns its path."""
    from hf_save_checkpoint import tiny_config, train_and_save

    config = tiny_config(str(run_dir), groups=groups, untied=untied, positions=positions)
    return train_and_save(dataclasses.replace(config, model=dataclasses.replace(config.model, **model_options)))


def train_tokenizers(root: Path) -> tuple[dict, list[str]]:
    """{kind: path} for every tokenizer data_prep builds (GPT-2 vocab+merges files too), and texts to encode."""
    from data_prep.corpus import write_embedded_corpus
    from data_prep.train_tokenizer import train_tokenizer
    from tokenizers import Tokenizer

    write_embedded_corpus(str(root / "corpus"), max_bytes=150_000)
    files = {kind: train_tokenizer([str(root / "corpus")], str(root / kind), kind, TOKENIZER_VOCAB,
                                   sample_bytes=150_000)
             for kind in ("sentencepiece-bpe", "sentencepiece-unigram", "bytelevel-bpe")}
    (root / "gpt2").mkdir()
    Tokenizer.from_file(files["bytelevel-bpe"]).model.save(str(root / "gpt2"))
    files["gpt2"] = str(root / "gpt2")
    texts = [p.read_text() for p in sorted((root / "corpus").iterdir())[:12]]
    texts += ["Hello  world\n\n  indented\tline ", "ünïcødé ✓ 日本語 😀", " lead", "a\nb\n", "x</s>y <|endoftext|> z",
              "3.14159 and 1234567 apples", "don't 'RE we'll"]
    return files, texts
