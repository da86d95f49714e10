"""The tokenizers data_prep builds (GPT-2 vocab+merges files, a trained byte-level BPE, SentencePiece BPE),
exported by export-gguf and tokenised by llama.cpp: the same ids as ours, with llama.cpp's defaults (special tokens
added as the GGUF says, a literal special token's text read as text, as data_prep's "text" does). A SentencePiece
unigram model, which llama.cpp segments otherwise, is refused in one line."""

import pytest

from llama_cpp_helpers import require_llama_cpp, train_tiny, train_tokenizers

require_llama_cpp()

KINDS = ["gpt2", "bytelevel-bpe", "sentencepiece-bpe"]


@pytest.fixture(scope="module")
def ggufs(megatron_world, tmp_path_factory):
    """{kind: (llama.cpp Llama over the GGUF, our data_prep tokenizer)} and the texts to encode."""
    from data_prep.tokenizers import load_tokenizer
    from pretrain.hf.gguf_check import llama_cpp_model
    from pretrain.hf.gguf_export import export_gguf

    root = tmp_path_factory.mktemp("tokenizer_ggufs")
    files, texts = train_tokenizers(root / "tokenizers")
    checkpoint = train_tiny(root / "run")
    out = {}
    for kind in KINDS:
        result = export_gguf(checkpoint, root / kind, tokenizer=files[kind], check=False)
        out[kind] = (llama_cpp_model(result["gguf"], 64), load_tokenizer(files[kind]))
    yield out, texts, files, checkpoint
    for llm, _ in out.values():
        llm.close()


@pytest.mark.parametrize("kind", KINDS)
def test_llama_cpp_tokenises_like_our_tokenizer(ggufs, kind):
    models, texts, _, _ = ggufs
    llm, ours = models[kind]
    for text in texts:
        assert llm.tokenize(text.encode("utf-8")) == list(ours.encode(text)), text[:60]


def test_a_sentencepiece_unigram_tokenizer_is_refused_with_exit_2_in_one_line(ggufs, tmp_path, capsys):
    from pretrain.hf.gguf_export import export_gguf_cli

    _, _, files, checkpoint = ggufs
    code = export_gguf_cli([checkpoint, "--output", str(tmp_path / "out"), "--tokenizer",
                            files["sentencepiece-unigram"]])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("export-gguf: error: cannot export to GGUF: a SentencePiece unigram tokenizer")
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.tmp-gguf").exists()
