"""export-gguf's parts that need no llama.cpp build: the refusals, the pre-tokenizer naming, the converter lookup.

(The conversions themselves, and llama.cpp's logits and tokens, are in tests/llama_cpp: `make test-llama-cpp`.
The config fields the converter reads: tests/hf/test_hf_rope_config.py.)
"""

import configparser
import json
import re
import sys
from pathlib import Path

import pytest

from pretrain.hf.gguf_support import (GPT2_PRE_TOKENIZER, LLAMA_CPP_PYTHON, byte_level_pre_tokenizer,
                                      check_llama_cpp_runs, check_tokenizer_runs, converter_dir)
from pretrain.table import model_preset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def byte_level_tokenizers(tmp_path_factory):
    """tokenizer.json as the HF export writes it, for a trained byte-level BPE and for GPT-2 vocab+merges files."""
    from data_prep.corpus import write_embedded_corpus
    from data_prep.tokenizers import load_tokenizer
    from data_prep.train_tokenizer import train_tokenizer
    from tokenizers import Tokenizer

    from pretrain.hf.tokenizer import hf_tokenizer

    root = tmp_path_factory.mktemp("tokenizers")
    write_embedded_corpus(str(root / "corpus"), max_bytes=30_000)
    trained = train_tokenizer([str(root / "corpus")], str(root / "bpe"), "bytelevel-bpe", 300, sample_bytes=30_000)
    (root / "gpt2").mkdir()
    Tokenizer.from_file(trained).model.save(str(root / "gpt2"))
    out = {}
    for kind, path in (("bytelevel-bpe", trained), ("gpt2", str(root / "gpt2"))):
        hf_tokenizer(load_tokenizer(path)).save_pretrained(root / f"hf_{kind}")
        out[kind] = json.loads((root / f"hf_{kind}" / "tokenizer.json").read_text())
    out["dirs"] = {kind: root / f"hf_{kind}" for kind in ("bytelevel-bpe", "gpt2")}
    for kind in ("sentencepiece-bpe", "sentencepiece-unigram"):  # the files export-hf writes for them
        model = train_tokenizer([str(root / "corpus")], str(root / kind), kind, 500, sample_bytes=30_000)
        hf_tokenizer(load_tokenizer(model)).save_pretrained(root / f"hf_{kind}")
        (root / f"hf_{kind}" / "tokenizer.model").write_bytes(Path(model).read_bytes())
        out["dirs"][kind] = root / f"hf_{kind}"
    return out


@pytest.mark.parametrize("kind", ["bytelevel-bpe", "gpt2"])
def test_our_byte_level_bpe_tokenizers_are_named_gpt2s_pre_tokenizer(byte_level_tokenizers, kind):
    assert byte_level_pre_tokenizer(byte_level_tokenizers[kind]) == GPT2_PRE_TOKENIZER


@pytest.mark.parametrize("change,named", [
    (lambda t: t["pre_tokenizer"].update(add_prefix_space=True), "add_prefix_space"),
    (lambda t: t["pre_tokenizer"].update(use_regex=False), "use_regex"),
    (lambda t: t.update(pre_tokenizer={"type": "Whitespace"}), "type"),
    (lambda t: t.update(normalizer={"type": "NFKC"}), "normalizer"),
    (lambda t: t["model"].update(ignore_merges=True), "model"),
], ids=["prefix_space", "no_regex", "whitespace", "normalizer", "ignore_merges"])
def test_a_pre_tokenizer_other_than_gpt2s_is_refused_in_one_line_naming_what_differs(byte_level_tokenizers, change,
                                                                                      named):
    tokenizer = json.loads(json.dumps(byte_level_tokenizers["bytelevel-bpe"]))
    change(tokenizer)
    with pytest.raises(ValueError, match=f"cannot export to GGUF: .*{named}") as error:
        byte_level_pre_tokenizer(tokenizer)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("kind", ["bytelevel-bpe", "gpt2", "sentencepiece-bpe"])
def test_tokenizers_llama_cpp_segments_alike_pass(byte_level_tokenizers, kind):
    check_tokenizer_runs(byte_level_tokenizers["dirs"][kind])


def test_a_sentencepiece_unigram_tokenizer_is_refused_in_one_line(byte_level_tokenizers, tmp_path):
    with pytest.raises(ValueError, match="cannot export to GGUF: a SentencePiece unigram tokenizer") as error:
        check_tokenizer_runs(byte_level_tokenizers["dirs"]["sentencepiece-unigram"])
    assert "\n" not in str(error.value)
    (tmp_path / "tokenizer.json").write_text(json.dumps({"model": {"type": "Unigram"}}))  # an HF one, no .model
    with pytest.raises(ValueError, match="unigram"):
        check_tokenizer_runs(tmp_path)


@pytest.mark.parametrize("options,scaling,feature", [
    ({}, "dynamic_ntk", "--rope-scaling dynamic_ntk"),
    ({"rope_proportion": 0.75}, "none", "p-RoPE"),
    ({"no_rope_freq": 2}, "none", "NoPE-interleaved"),
    ({"no_rope_freq": 1}, "none", "no RoPE in any layer"),
    ({"window_size": 8, "qk_layernorm": True}, "none", "sliding-window"),
    ({"add_qkv_bias": True, "kv_channels": 8}, "none", "Qwen2"),
], ids=["dynamic_ntk", "prope", "nope_interleaved", "nope_everywhere", "sliding_window", "qwen2_head_dim"])
def test_what_llama_cpp_runs_otherwise_is_refused_in_one_line_naming_the_feature(options, scaling, feature):
    with pytest.raises(ValueError, match=f"cannot export to GGUF: {re.escape(feature)}.*; .*export") as error:
        check_llama_cpp_runs(model_preset("tiny", **options), scaling)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("options,scaling", [({}, "none"), ({}, "yarn"), ({}, "llama3"), ({"add_qkv_bias": True}, "pi"),
                                             ({"qk_layernorm": True}, "ntk")],
                         ids=["llama", "yarn", "llama3", "qwen2", "qwen3"])
def test_what_llama_cpp_runs_the_same_passes(options, scaling):
    check_llama_cpp_runs(model_preset("tiny", **options), scaling)


def test_a_missing_converter_is_refused_naming_the_flag_the_variable_and_where_to_get_it(tmp_path, monkeypatch):
    monkeypatch.delenv("LLAMA_CPP_DIR", raising=False)
    with pytest.raises(FileNotFoundError, match=f"--llama-cpp DIR or set LLAMA_CPP_DIR.*{LLAMA_CPP_PYTHON}"):
        converter_dir()
    with pytest.raises(FileNotFoundError, match=f"{tmp_path} is not a llama.cpp source tree"):
        converter_dir(tmp_path)


def test_the_llama_cpp_release_is_the_one_the_extra_and_the_makefile_install():
    extras = configparser.ConfigParser()
    extras.read(REPO / "setup.cfg")
    assert f"llama-cpp-python=={LLAMA_CPP_PYTHON}" in extras["options.extras_require"]["llama-cpp"].split()
    assert f"LLAMA_CPP_PYTHON := {LLAMA_CPP_PYTHON}" in (REPO / "Makefile").read_text().splitlines()


@pytest.fixture(scope="module")
def checkpoint(megatron_world, tmp_path_factory):
    """A tiny trained PosAug checkpoint (2 steps)."""
    from hf_save_checkpoint import tiny_config, train_and_save

    return train_and_save(tiny_config(str(tmp_path_factory.mktemp("gguf") / "run"), groups=2, untied=False))


def test_export_gguf_refuses_dynamic_ntk_with_exit_2_in_one_line_naming_the_alternative(checkpoint, tmp_path, capsys):
    from pretrain.hf.gguf_export import export_gguf_cli

    code = export_gguf_cli([checkpoint, "--output", str(tmp_path / "out"), "--rope-scaling", "dynamic",
                            "--factor", "2", "--llama-cpp", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("export-gguf: error: cannot export to GGUF: --rope-scaling dynamic_ntk") and "yarn" in err
    assert not (tmp_path / "out").exists()


def test_export_gguf_refuses_no_tokenizer_in_one_line(checkpoint, tmp_path, capsys):
    from pretrain.hf.gguf_export import export_gguf_cli

    assert export_gguf_cli([checkpoint, "--output", str(tmp_path / "out"), "--no-tokenizer"]) == 2
    assert capsys.readouterr().err == ("export-gguf: error: export-gguf needs the tokenizer (a GGUF carries it): "
                                       "drop --no-tokenizer\n")
