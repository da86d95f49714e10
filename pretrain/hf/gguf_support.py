"""What llama.cpp runs the same as transformers, decided before any weight is read (no torch, no llama.cpp needed).

`export-gguf` (pretrain.hf.gguf_export) hands our Hugging Face export to llama.cpp's own converter
(`convert_hf_to_gguf.py` of the llama.cpp that llama-cpp-python LLAMA_CPP_PYTHON vendors). Read in that
converter and in llama.cpp's model graphs (src/models/*.cpp) of that release, and checked by `make test-llama-cpp`:

- Llama with plain RoPE, `rope_type` linear / yarn / llama3 and static NTK (a changed `rope_theta`), GQA, tied and
  untied embeddings; Qwen2 (q/k/v biases) and Qwen3 (QK-norm) with full attention in every layer: converted and
  equal to transformers.
- Refused here, one line each (REFUSALS' reasons):
  dynamic NTK: the converter skips rope_type "dynamic" ("HunYuan, handled in model class") and llama.cpp runs plain
  RoPE, another model past the window with no word from either side;
  p-RoPE: llama.cpp's llama graph asserts n_rot == head_dim and the converter ignores partial_rotary_factor;
  NoPE-interleaved layers (Llama 4 text): llama.cpp's llama4 takes NoPE every 4th layer with 8192-token chunked
  attention, a fixed temperature (0.1, 8192) and a q/k L2 norm, or, with every layer "full_attention", RoPE in every
  layer; and it reads every layer as mixture-of-experts (interleave_moe_layer_step);
  sliding-window layers: llama.cpp's qwen2 / qwen3 graphs attend to every key (the converter drops layer_types).
- Byte-level BPE tokenizers: the converter names llama.cpp's pre-tokenizer by hashing the ids a fixed text gets,
  which knows no newly trained vocabulary. Ours (data_prep's GPT-2 BPE files and trained byte-level BPE) use GPT-2's
  pre-tokenizer exactly (ByteLevel, GPT-2's regex, no prefix space, no normalizer), so export-gguf names it
  explicitly (byte_level_pre_tokenizer); anything else is refused in one line.
- SentencePiece: BPE models tokenise the same in llama.cpp; unigram models are refused (check_tokenizer_runs):
  llama.cpp's SentencePiece tokenizer merges pieces by score, BPE's rule, not unigram's best segmentation, and the
  converter writes every SentencePiece model that way (measured: other ids on data_prep's embedded corpus).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["GGUF_TYPES", "LLAMA_CPP_PYTHON", "check_llama_cpp_runs", "check_tokenizer_runs", "byte_level_pre_tokenizer",
           "converter_dir", "logits_tolerance"]

LLAMA_CPP_PYTHON = "0.3.36"  # the release whose vendored converter and runtime were read and checked
GGUF_TYPES = ("f32", "f16")  # converter --outtype values export-gguf offers (quantised types change the model)
# Largest |logit difference| between llama.cpp and transformers the check accepts, per GGUF type. F32 differs
# by float32 summation order only (~1e-5 measured up to 16 w); F16 rounds every weight to 11 bits.
_TOLERANCE = {"f32": 1e-4, "f16": 5e-2}
# llama.cpp's name for GPT-2's pre-tokenizer (LLAMA_VOCAB_PRE_TYPE_GPT2: GPT-2's regex, byte-level).
GPT2_PRE_TOKENIZER = "gpt-2"
LLAMA_CPP_DIR_ENV = "LLAMA_CPP_DIR"
_GET_CONVERTER = (f"pip download --no-binary :all: --no-deps llama-cpp-python=={LLAMA_CPP_PYTHON}, unpack it and "
                  "pass its vendor/llama.cpp (`make llama-cpp-converter` puts it in .llama-cpp/)")


def logits_tolerance(gguf_type: str) -> float:
    """The largest |logit difference| to transformers the GGUF check accepts for a GGUF type."""
    return _TOLERANCE[gguf_type]


def check_llama_cpp_runs(model_config, scaling_kind: str) -> None:
    """ValueError (one line: the feature, the alternative) unless llama.cpp runs this export as transformers does."""
    if scaling_kind == "dynamic_ntk":
        raise ValueError("cannot export to GGUF: --rope-scaling dynamic_ntk: llama.cpp has no dynamic NTK (its "
                         "converter skips rope_type 'dynamic' and llama.cpp then runs plain RoPE, other logits from "
                         "the window on); export --rope-scaling yarn or ntk with --factor F, or use export-hf")
    proportion = float(getattr(model_config, "rope_proportion", 1.0))
    if proportion < 1.0:
        raise ValueError(f"cannot export to GGUF: p-RoPE (model.rope_proportion={proportion:g}): llama.cpp's llama "
                         "graph rotates every channel of a head and its converter ignores partial_rotary_factor; "
                         "use export-hf (transformers >= 5.5)")
    if getattr(model_config, "no_rope_freq", None) == 1:
        raise ValueError("cannot export to GGUF: no RoPE in any layer (a recalibrated DroPE checkpoint, or "
                         "model.no_rope_freq=1): llama.cpp's one graph with NoPE layers, llama4, keeps RoPE in 3 of "
                         "every 4 layers; use export-hf (Llama 4 text in transformers)")
    if getattr(model_config, "no_rope_freq", None) is not None:
        raise ValueError(f"cannot export to GGUF: NoPE-interleaved layers (model.no_rope_freq="
                         f"{model_config.no_rope_freq}): llama.cpp's llama4 fixes NoPE at every 4th layer with "
                         "8192-token chunks, its own temperature and a q/k norm, and reads every layer as "
                         "mixture-of-experts; use export-hf (Llama 4 text in transformers)")
    heads, head_dim = model_config.num_attention_heads, model_config.kv_channels
    if (getattr(model_config, "add_qkv_bias", False) and not getattr(model_config, "qk_layernorm", False)
            and heads * head_dim != model_config.hidden_size):
        raise ValueError(f"cannot export to GGUF: Qwen2 (q/k/v biases, model.add_qkv_bias) with heads x head_dim = "
                         f"{heads} x {head_dim} != hidden_size {model_config.hidden_size}: llama.cpp's qwen2 sizes "
                         "attention by hidden_size; use export-hf")
    if getattr(model_config, "window_size", None) is not None:
        raise ValueError(f"cannot export to GGUF: sliding-window layers (model.window_size="
                         f"{model_config.window_size}): llama.cpp's qwen2 / qwen3 attend to every key in every layer "
                         "(its converter drops layer_types); use export-hf (Qwen2 / Qwen3 in transformers)")


def check_tokenizer_runs(path: str | os.PathLike) -> None:
    """ValueError (one line) when a tokenizer (a SentencePiece .model, a tokenizer.json, or a directory with one) is
    a unigram model, which llama.cpp segments otherwise."""
    import json

    path = Path(path)
    if path.is_dir():
        path = next((path / name for name in ("tokenizer.model", "tokenizer.json") if (path / name).is_file()), path)
    unigram = False
    if path.is_file() and path.suffix == ".model":
        from sentencepiece import sentencepiece_model_pb2

        proto = sentencepiece_model_pb2.ModelProto()
        proto.ParseFromString(path.read_bytes())
        unigram = proto.trainer_spec.model_type == 1
    elif path.is_file() and path.suffix == ".json":
        unigram = (json.loads(path.read_text()).get("model") or {}).get("type") == "Unigram"
    if unigram:
        raise ValueError("cannot export to GGUF: a SentencePiece unigram tokenizer: llama.cpp tokenises SentencePiece "
                         "by merging pieces by score (BPE's rule), which gives unigram vocabularies other ids; train "
                         "one with data_prep train-tokenizer --kind sentencepiece-bpe or bytelevel-bpe, or use "
                         "export-hf")


def byte_level_pre_tokenizer(tokenizer_json: dict[str, Any]) -> str:
    """llama.cpp's name for a byte-level BPE tokenizer.json's pre-tokenizer if it is GPT-2's, else ValueError."""
    model = tokenizer_json.get("model") or {}
    pre = tokenizer_json.get("pre_tokenizer") or {}
    gpt2_pre = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}
    differs = [key for key, value in gpt2_pre.items() if pre.get(key, True if key == "use_regex" else None) != value]
    if tokenizer_json.get("normalizer") is not None:
        differs.append("normalizer")
    if model.get("type") != "BPE" or model.get("byte_fallback") or model.get("ignore_merges"):
        differs.append("model")
    if differs:
        raise ValueError(f"cannot export to GGUF: the tokenizer's pre-tokenization ({', '.join(differs)} of "
                         f"tokenizer.json) is not GPT-2's byte-level one, and llama.cpp's converter knows no other "
                         "newly trained vocabulary; pass a SentencePiece or GPT-2-style byte-level BPE --tokenizer")
    return GPT2_PRE_TOKENIZER


def converter_dir(explicit: str | os.PathLike | None = None) -> Path:
    """The llama.cpp source tree with convert_hf_to_gguf.py: --llama-cpp, else $LLAMA_CPP_DIR (FileNotFoundError)."""
    chosen = explicit or os.environ.get(LLAMA_CPP_DIR_ENV)
    if not chosen:
        raise FileNotFoundError(f"llama.cpp's converter is needed: pass --llama-cpp DIR or set {LLAMA_CPP_DIR_ENV} "
                                f"(a llama.cpp source tree; {_GET_CONVERTER})")
    path = Path(chosen)
    if not ((path / "convert_hf_to_gguf.py").is_file() and (path / "conversion" / "__init__.py").is_file()):
        raise FileNotFoundError(f"{path} is not a llama.cpp source tree with convert_hf_to_gguf.py and conversion/ "
                                f"(--llama-cpp / {LLAMA_CPP_DIR_ENV}); {_GET_CONVERTER}")
    return path
