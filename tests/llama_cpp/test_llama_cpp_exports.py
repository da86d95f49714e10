"""Every export kind through `export-gguf`: converted by llama.cpp's converter and equal to transformers in llama.cpp
(logits at w/2, w - 1, 4w - 1 and 8w - 1 within pretrain.hf.gguf_support's tolerance), or refused by us in one line.

docs/hf.md's GGUF table lists the same kinds. One tiny checkpoint per architecture or strategy, 2 training steps.
"""

import json

import pytest

from llama_cpp_helpers import WINDOW, require_llama_cpp, train_tiny, train_tokenizers

require_llama_cpp()

from pretrain.hf.gguf_export import convert_to_gguf, export_gguf, export_gguf_cli  # noqa: E402
from pretrain.hf.gguf_support import logits_tolerance  # noqa: E402

# checkpoint -> (train_tiny options)
CHECKPOINTS = {
    "posaug_gqa_tied": dict(groups=2, untied=False),
    "baseline_mha_untied": dict(groups=4, untied=True, positions={"strategy": "none"}),
    "rfs": dict(positions={"strategy": "rfs", "max_position": 100}),
    "rpe": dict(positions={"strategy": "rpe", "max_position": 8 * WINDOW}),
    "warp": dict(positions={"strategy": "warp"}),
    "qwen2_qkv_bias": dict(add_qkv_bias=True),
    "qwen3_qk_norm": dict(qk_layernorm=True),
    "qwen3_sliding_window": dict(qk_layernorm=True, window_size=8, window_attn_skip_freq=2),
    "llama4_nope_interleaved": dict(no_rope_freq=2),
    "prope": dict(rope_proportion=0.75),
}
# export kind -> (checkpoint, export-gguf options)
CONVERTED = {
    "posaug": ("posaug_gqa_tied", {}),
    "baseline_mha_untied": ("baseline_mha_untied", {}),
    "rfs_linear": ("rfs", {}),
    "rpe": ("rpe", {}),
    "warp": ("warp", {}),
    "linear": ("posaug_gqa_tied", {"rope_scaling": "pi", "factor": 4.0}),
    "ntk": ("posaug_gqa_tied", {"rope_scaling": "ntk", "factor": 4.0}),
    "yarn": ("posaug_gqa_tied", {"rope_scaling": "yarn", "factor": 4.0}),
    "llama3": ("posaug_gqa_tied", {"rope_scaling": "llama3", "factor": 4.0}),
    "qwen2_qkv_bias": ("qwen2_qkv_bias", {}),
    "qwen3_qk_norm": ("qwen3_qk_norm", {}),
    "f16": ("posaug_gqa_tied", {"gguf_type": "f16"}),
}
# export kind -> (checkpoint, export-gguf flags, the feature the one-line refusal names)
REFUSED = {
    "dynamic_ntk": ("posaug_gqa_tied", ["--rope-scaling", "dynamic", "--factor", "2"], "--rope-scaling dynamic_ntk"),
    "qwen3_sliding_window": ("qwen3_sliding_window", [], "sliding-window layers"),
    "llama4_nope_interleaved": ("llama4_nope_interleaved", [], "NoPE-interleaved layers"),
    "prope": ("prope", [], "p-RoPE"),
}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """A SentencePiece BPE tokenizer trained by data_prep (the tokenizer kinds: test_llama_cpp_tokenizers.py)."""
    files, _ = train_tokenizers(tmp_path_factory.mktemp("tokenizers"))
    return files["sentencepiece-bpe"]


@pytest.fixture(scope="module")
def checkpoints(megatron_world, tmp_path_factory):
    """One tiny trained checkpoint per entry of CHECKPOINTS."""
    root = tmp_path_factory.mktemp("runs")
    return {name: train_tiny(root / name, **options) for name, options in CHECKPOINTS.items()}


@pytest.mark.parametrize("kind", list(CONVERTED))
def test_export_converts_and_runs_in_llama_cpp_as_in_transformers_to_8_windows(checkpoints, tokenizer, tmp_path,
                                                                                 kind):
    checkpoint, options = CONVERTED[kind]
    result = export_gguf(checkpoints[checkpoint], tmp_path / "out", tokenizer=tokenizer, **options)
    check = result["check"]
    assert check["positions"] == [WINDOW // 2, WINDOW - 1, 4 * WINDOW - 1, 8 * WINDOW - 1]
    assert check["max_abs_diff"] <= logits_tolerance(options.get("gguf_type", "f32"))
    assert result["gguf"].is_file() and (result["hf"] / "config.json").is_file()


@pytest.mark.parametrize("kind", list(REFUSED))
def test_what_llama_cpp_runs_otherwise_is_refused_with_exit_2_in_one_line(checkpoints, tokenizer, tmp_path, capsys,
                                                                           kind):
    checkpoint, flags, feature = REFUSED[kind]
    code = export_gguf_cli([checkpoints[checkpoint], "--output", str(tmp_path / "out"), "--tokenizer", tokenizer,
                            *flags])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"export-gguf: error: cannot export to GGUF: {feature}") and "export-hf" in err
    assert not (tmp_path / "out").exists()


def test_dynamic_ntk_converted_anyway_runs_as_another_model_in_llama_cpp(checkpoints, tokenizer, tmp_path):
    """Why dynamic NTK is refused: the converter takes it, llama.cpp runs plain RoPE, the check sees it past w."""
    from pretrain.hf.export import export_checkpoint
    from pretrain.hf.gguf_check import check_gguf

    export_checkpoint(checkpoints["posaug_gqa_tied"], tmp_path / "hf", tokenizer=tokenizer,
                      rope_scaling="dynamic_ntk", factor=4.0)
    gguf = convert_to_gguf(tmp_path / "hf", tmp_path / "model.gguf")
    with pytest.raises(RuntimeError, match="the GGUF's logits differ from transformers'"):
        check_gguf(tmp_path / "hf", gguf, WINDOW, "f32")


def test_the_check_fails_in_one_line_when_the_gguf_is_another_model(checkpoints, tokenizer, tmp_path):
    """The check itself: a GGUF of the untied baseline checked against the PosAug export fails."""
    from pretrain.hf.gguf_check import check_gguf

    posaug = export_gguf(checkpoints["posaug_gqa_tied"], tmp_path / "a", tokenizer=tokenizer, check=False)
    other = export_gguf(checkpoints["rpe"], tmp_path / "b", tokenizer=tokenizer, check=False)
    with pytest.raises(RuntimeError, match=r"differ from transformers' by .* at position \d+ \(> 0.0001 for f32") \
            as error:
        check_gguf(posaug["hf"], other["gguf"], WINDOW, "f32")
    assert "\n" not in str(error.value)


def test_the_gguf_announces_no_bos_or_eos_where_transformers_adds_none(checkpoints, tokenizer, tmp_path):
    import gguf

    result = export_gguf(checkpoints["posaug_gqa_tied"], tmp_path / "out", tokenizer=tokenizer, check=False)
    fields = gguf.GGUFReader(result["gguf"]).fields
    assert [fields[k].contents() for k in ("tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token")] == \
        [False, False]
    assert json.loads((result["hf"] / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
