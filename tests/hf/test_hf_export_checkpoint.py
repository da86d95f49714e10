"""export-hf / import-hf on real checkpoints: TP=1 and TP=2/PP=2 saves, tokenizers, RFS, round trip.

(Every RoPE scaling kind is in test_hf_rope_config.py; fault regressions in test_faults_hf.py.)
"""

import json
import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))

from conftest import run_torchrun  # noqa: E402
from hf_helpers import VOCAB, auto_model, megatron_logits, megatron_model, sample_tokens, save_hf_llama  # noqa: E402
from hf_save_checkpoint import tiny_config, train_and_save  # noqa: E402
from megatron_ext.positions import build_sampler  # noqa: E402
from pretrain.hf import hf_logits  # noqa: E402
from pretrain.hf.export import export_checkpoint, export_cli  # noqa: E402
from pretrain.hf.importer import import_cli, import_hf, read_hf_weights  # noqa: E402
from pretrain.hf.tokenizer import hf_tokenizer  # noqa: E402

pytestmark = [pytest.mark.slow]  # torchrun TP=2/PP=2 saves


@pytest.fixture(scope="module")
def tokenizer_files(tmp_path_factory):
    """SentencePiece BPE and unigram, a tokenizer.json, and GPT-2 vocab.json+merges.txt, trained here."""
    from data_prep.corpus import write_embedded_corpus
    from data_prep.train_tokenizer import train_tokenizer
    from tokenizers import Tokenizer

    root = tmp_path_factory.mktemp("tokenizers")
    write_embedded_corpus(str(root / "corpus"), max_bytes=150_000)
    files = {kind: train_tokenizer([str(root / "corpus")], str(root / kind), kind, 500, sample_bytes=150_000)
             for kind in ("sentencepiece-bpe", "sentencepiece-unigram", "bytelevel-bpe")}
    (root / "gpt2").mkdir()
    Tokenizer.from_file(files["bytelevel-bpe"]).model.save(str(root / "gpt2"))
    files["gpt2"] = str(root / "gpt2")
    texts = [p.read_text() for p in sorted((root / "corpus").iterdir())[:12]]
    texts += ["Hello  world\n\n  indented\tline ", "ünïcødé ✓ 日本語 😀", " lead", "a\nb\n", "x</s>y <|endoftext|> z"]
    return files, texts


@pytest.fixture(scope="module")
def checkpoints(megatron_world, tmp_path_factory):
    """Trained tiny checkpoints: two saved with TP=1/PP=1 here, two with TP=2/PP=2 under torchrun."""
    root = tmp_path_factory.mktemp("checkpoints")
    out = {"tp1_gqa_untied": train_and_save(tiny_config(str(root / "a"), groups=2, untied=True)),
           "tp1_mha_tied": train_and_save(tiny_config(str(root / "b"), groups=4, untied=False)),
           "rfs": train_and_save(tiny_config(str(root / "rfs"), groups=2, untied=False,
                                             positions={"strategy": "rfs", "max_position": 100}))}
    results = run_torchrun("tests/distributed/hf_save_checkpoint.py", 4, "--tp", "2", "--pp", "2",
                           "--variant", f"{root / 'c'}:2:tied", "--variant", f"{root / 'd'}:4:untied", timeout=240)
    out["tp2pp2_gqa_tied"], out["tp2pp2_mha_untied"] = (r["path"] for r in results)
    return out


@pytest.mark.parametrize("name", ["tp1_gqa_untied", "tp1_mha_tied", "tp2pp2_gqa_tied", "tp2pp2_mha_untied"])
def test_auto_model_logits_equal_megatron_logits(checkpoints, tmp_path, name):
    export_checkpoint(checkpoints[name], tmp_path / "hf", no_tokenizer=True)
    model, _ = megatron_model(checkpoints[name])
    tokens, positions = sample_tokens(32), torch.arange(32, dtype=torch.float32)
    torch.testing.assert_close(hf_logits(auto_model(tmp_path / "hf"), tokens),
                               megatron_logits(model, tokens, positions), atol=1e-4, rtol=0)


def test_export_directory_has_config_generation_config_tokenizer_and_sharded_weights(
        checkpoints, tokenizer_files, tmp_path):
    files, _ = tokenizer_files
    code = export_cli([str(Path(checkpoints["tp2pp2_gqa_tied"]).parent), "--output",
                       str(tmp_path / "hf"), "--tokenizer", files["sentencepiece-bpe"], "--max-shard-size", "100KB"])
    assert code == 0
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert (config["num_key_value_heads"], config["head_dim"], config["rms_norm_eps"]) == (2, 16, 1e-5)
    assert config["rope_parameters"] == {"rope_type": "default", "rope_theta": 10000.0}
    assert config["tie_word_embeddings"] is True and config["max_position_embeddings"] == 8 * 32  # PosAug: 8w
    assert (config["bos_token_id"], config["eos_token_id"], config["vocab_size"]) == (1, 2, VOCAB)
    assert config["posaug_training"]["strategy"] == "posaug"
    generation = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    assert generation["eos_token_id"] == 2 and generation.get("do_sample", False) is False  # 4.x omits defaults
    index = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1 and "lm_head.weight" not in index["weight_map"]
    assert (tmp_path / "hf" / "tokenizer.json").is_file() and (tmp_path / "hf" / "tokenizer.model").is_file()


@pytest.mark.parametrize("kind", ["sentencepiece-bpe", "sentencepiece-unigram", "bytelevel-bpe", "gpt2"])
def test_auto_tokenizer_encodes_like_our_tokenizer(tokenizer_files, tmp_path, kind):
    from data_prep.tokenizers import load_tokenizer
    from transformers import AutoTokenizer

    files, texts = tokenizer_files
    ours = load_tokenizer(files[kind])
    hf_tokenizer(ours).save_pretrained(tmp_path)
    auto = AutoTokenizer.from_pretrained(tmp_path)
    for text in texts:
        assert auto(text)["input_ids"] == ours.encode(text), text[:80]
    assert auto.decode(ours.encode(texts[0])) == ours.decode(ours.encode(texts[0]))


def test_auto_tokenizer_honours_special_tokens_when_the_build_did(tokenizer_files, tmp_path):
    from data_prep.tokenizers import load_tokenizer
    from transformers import AutoTokenizer

    files, texts = tokenizer_files
    ours = load_tokenizer(files["bytelevel-bpe"], special_tokens="honour")
    hf_tokenizer(ours).save_pretrained(tmp_path)
    auto = AutoTokenizer.from_pretrained(tmp_path)
    special = [text for text in texts if "<|endoftext|>" in text]
    assert special
    for text in special:
        assert auto(text)["input_ids"] == ours.encode(text), text[:80]
    assert auto(special[0])["input_ids"] != load_tokenizer(files["bytelevel-bpe"]).encode(special[0])


@pytest.mark.parametrize("eval_length", [None, 128], ids=["default_window_x8", "explicit"])
def test_rfs_export_scaling_reproduces_evaluation_position_logits(checkpoints, tmp_path, eval_length):
    export_checkpoint(checkpoints["rfs"], tmp_path / "hf", no_tokenizer=True, eval_length=eval_length)
    model, config = megatron_model(checkpoints["rfs"])
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["rope_parameters"]["rope_type"] == "linear"
    sampler = build_sampler(config.positions, seed=config.seed, train_seq_len=32, num_layers=4, rotary_dim=16,
                            rotary_base=10000.0, total_steps=1)
    eval_length = eval_length or 32 * 8
    tokens = sample_tokens(eval_length, seed=1)
    expected = megatron_logits(model, tokens, sampler.evaluation(eval_length))
    torch.testing.assert_close(hf_logits(auto_model(tmp_path / "hf"), tokens), expected, atol=1e-4, rtol=0)


def test_greedy_generate_equals_megatron_greedy_decoding(checkpoints, tmp_path):
    export_checkpoint(checkpoints["tp2pp2_mha_untied"], tmp_path / "hf", no_tokenizer=True)
    model, _ = megatron_model(checkpoints["tp2pp2_mha_untied"])
    prompt = sample_tokens(8, seed=3)[:1]
    generated = auto_model(tmp_path / "hf").generate(prompt, attention_mask=torch.ones_like(prompt),
                                                     max_new_tokens=6, do_sample=False)
    tokens = prompt
    for _ in range(6):
        logits = megatron_logits(model, tokens, torch.arange(tokens.shape[1], dtype=torch.float32))
        tokens = torch.cat([tokens, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(generated, tokens)


@pytest.fixture(scope="module")
def hf_llama_dir(tmp_path_factory, tokenizer_files):
    """A randomly initialised GQA Llama saved by transformers itself, with SentencePiece tokenizer files."""
    return save_hf_llama(tmp_path_factory.mktemp("llama"), tokenizer_files[0]["sentencepiece-bpe"])


def assert_same_weights_and_architecture(original, exported, served=None):
    a, b = read_hf_weights(original), read_hf_weights(exported)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)
    keys = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_parameters", "tie_word_embeddings",
            "max_position_embeddings")
    ca, cb = (json.loads((p / "config.json").read_text()) for p in (Path(original), Path(exported)))
    if served is not None:  # a run set to another method announces the context that method serves
        assert cb.pop("max_position_embeddings") == served
        keys = tuple(k for k in keys if k != "max_position_embeddings")
    assert {k: ca[k] for k in keys} == {k: cb[k] for k in keys}


def test_import_then_export_is_bit_identical(megatron_world, hf_llama_dir, tmp_path):
    import_hf(hf_llama_dir, tmp_path / "run")
    assert export_cli([str(tmp_path / "run"), "--output", str(tmp_path / "hf")]) == 0
    assert_same_weights_and_architecture(hf_llama_dir, tmp_path / "hf")


def test_import_under_tensor_parallel_then_export_is_bit_identical(megatron_world, hf_llama_dir, tmp_path):
    run_torchrun("tests/distributed/hf_import.py", 2, "--hf", str(hf_llama_dir), "--output", str(tmp_path / "run"),
                 "--tp", "2", "--set", "positions.strategy=posaug", timeout=180)
    export_checkpoint(tmp_path / "run", tmp_path / "hf")
    assert_same_weights_and_architecture(hf_llama_dir, tmp_path / "hf", served=8 * 32)  # PosAug: alpha_max * w
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["posaug_training"]["strategy"] == "posaug"


def test_missing_tokenizer_is_refused_with_the_flags_to_use(checkpoints, tmp_path, capsys):
    assert export_cli([checkpoints["tp1_mha_tied"], "--output", str(tmp_path / "hf")]) == 2
    assert "--tokenizer PATH" in capsys.readouterr().err and not (tmp_path / "hf").exists()


def test_non_empty_output_is_refused_without_overwrite(checkpoints, tmp_path, capsys):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "keep.txt").write_text("mine")
    args = [checkpoints["tp1_mha_tied"], "--output", str(tmp_path / "hf"), "--no-tokenizer"]
    assert export_cli(args) == 2 and "--overwrite" in capsys.readouterr().err
    assert export_cli(args + ["--overwrite"]) == 0 and not (tmp_path / "hf" / "keep.txt").exists()


def test_non_swiglu_model_is_refused_on_import(hf_llama_dir, tmp_path, capsys):
    (tmp_path / "gelu").mkdir()
    config = json.loads((hf_llama_dir / "config.json").read_text())
    (tmp_path / "gelu" / "config.json").write_text(json.dumps({**config, "hidden_act": "gelu"}))
    assert os.path.exists(hf_llama_dir / "model.safetensors")
    assert import_cli(["--hf", str(tmp_path / "gelu"), "--output", str(tmp_path / "run")]) == 2
    assert "need silu: SwiGLU" in capsys.readouterr().err
