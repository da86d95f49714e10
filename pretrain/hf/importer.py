"""Hugging Face import: a Llama / Mistral / Qwen2 directory -> our checkpoint (iteration 0) under any TP/PP.

Only what our Megatron model reproduces exactly is imported (SUPPORTED; logits equal the HF
model's): every other architecture or feature is refused in one line naming the model type,
what is missing, and the supported list. Everything that can be wrong with the input
(config.json, an architecture we cannot express, HF tensors it does not declare, missing or
truncated safetensors) is found before anything is written. The run directory is
built next to the target (`<output>.tmp-import`) and swapped in only when complete, so
`--overwrite` never costs the old run on a bad input.

The run keeps the HF tokenizer files (and generation_config.json) unchanged in `tokenizer/`
and records the special-token ids, so `export-hf` of the run ships them bit for bit.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

import torch

from pretrain.faults import naming_output
from data_prep.overlap import check_apart
from megatron_ext.model import ModelConfig
from pretrain.hf.export import check_output, publish
from pretrain.hf.rope import hf_rope_parameters
from pretrain.hf.tokenizer import TOKENIZER_FILES, copy_tokenizer_files
from pretrain.hf.weight_map import hf_to_megatron_names, shard_for_rank

SPECIAL_TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")


def read_hf_weights(hf_dir: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of an HF directory (model.safetensors or its sharded index); ValueError names a bad file."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    hf_dir = Path(hf_dir)
    index = hf_dir / "model.safetensors.index.json"
    if index.is_file():
        from pretrain.trainer.config_values import read_json

        files = sorted(set(read_json(index, "safetensors index")["weight_map"].values()))
    elif (hf_dir / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise FileNotFoundError(f"{hf_dir}: no model.safetensors or model.safetensors.index.json "
                                "(PyTorch .bin checkpoints are not read; re-save with safetensors)")
    state: dict[str, torch.Tensor] = {}
    for name in files:
        path = hf_dir / name
        if not path.is_file():
            raise FileNotFoundError(f"{path}: listed in model.safetensors.index.json but missing; "
                                    "download the complete model")
        try:
            state.update(load_file(str(path)))
        except SafetensorError as error:
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise ValueError(f"{path}: truncated or corrupt safetensors file ({reason}); download it again "
                             "or re-save the model with save_pretrained") from error
    return state


# The HF model types imported exactly, with what each brings beyond the PosAug architecture
# (RMSNorm, SwiGLU, GQA, non-interleaved RoPE). README's "Importing Hugging Face models" table has
# one row per type (a test keeps the two in step).
SUPPORTED = {
    "llama": "Llama 1-3.x, RoPE unscaled or llama3-scaled",
    "mistral": "Mistral without a sliding window",
    "qwen2": "Qwen2/Qwen2.5, q/k/v biases",
}
# Architectures people bring, and what our Megatron model lacks for each (the refusal names it).
MISSING_FEATURES = {
    "gpt2": "learned absolute position embeddings (no RoPE), LayerNorm with biases, GELU MLP",
    "gpt_neox": "LayerNorm with biases, parallel attention and MLP, partial rotary, GELU MLP",
    "gptj": "LayerNorm, parallel attention and MLP, interleaved partial rotary, GELU MLP",
    "gemma": "GELU MLP (gelu_pytorch_tanh), RMSNorm with a +1 weight offset, embeddings scaled by sqrt(hidden_size)",
    "gemma2": "GELU MLP, RMSNorm with a +1 offset and post-norms, logit soft-capping, sliding-window layers",
    "gemma3_text": "GELU MLP, RMSNorm with a +1 offset and post-norms, QK-norm, sliding-window layers",
    "olmo": "non-parametric LayerNorm (no weights), optional QKV clipping",
    "olmo2": "QK-norm (RMSNorm on q and k before RoPE) and norms after attention and MLP instead of before",
    "qwen3": "QK-norm (RMSNorm on q and k before RoPE)",
    "phi": "LayerNorm with biases, parallel attention and MLP, partial rotary, GELU MLP",
    "phi3": "fused qkv_proj and gate_up_proj projections (and longrope scaling)",
    "mixtral": "mixture-of-experts MLP",
    "qwen2_moe": "mixture-of-experts MLP",
    "qwen3_moe": "mixture-of-experts MLP and QK-norm",
    "deepseek_v2": "multi-head latent attention and mixture-of-experts MLP",
    "deepseek_v3": "multi-head latent attention and mixture-of-experts MLP",
    "falcon": "LayerNorm, parallel attention and MLP, multi-query fused QKV, GELU MLP",
    "starcoder2": "LayerNorm with biases, GELU MLP with biases, sliding window",
    "stablelm": "LayerNorm, partial rotary",
    "cohere": "LayerNorm, parallel attention and MLP, logit scale",
    "mpt": "ALiBi positions, LayerNorm, GELU MLP",
    "bloom": "ALiBi positions, LayerNorm with biases, GELU MLP",
    "opt": "learned absolute position embeddings, LayerNorm with biases, ReLU MLP",
}
LONGROPE_REASON = ("rope_type 'longrope' (Phi-3's per-frequency short/long factor lists, switched when the "
                   "sequence outgrows original_max_position_embeddings) is not implemented: float training positions "
                   "(PosAug, RFS) have no sequence length to switch on")


def supported_list() -> str:
    """The supported HF model types in one phrase, for refusals."""
    return "; ".join(f"{kind} ({what})" for kind, what in SUPPORTED.items())


def _sliding_window(get, model_type: str) -> str | None:
    """How the config turns on sliding-window attention (None when every layer is full causal)."""
    layer_types = get("layer_types") or []
    if "sliding_attention" in layer_types:
        return f"sliding-window attention (layer_types has sliding_attention, sliding_window={get('sliding_window')})"
    window = get("sliding_window")
    if window in (None, 0):
        return None
    if model_type == "qwen2":
        if get("use_sliding_window", False) and int(get("max_window_layers") or 0) < int(get("num_hidden_layers") or 0):
            return f"sliding-window attention (use_sliding_window=true, sliding_window={window})"
        return None
    return f"sliding-window attention (sliding_window={window}; import a checkpoint with sliding_window null)"


def model_config_from_hf(hf_config, *, seq_length: int | None = None,
                         make_vocab_size_divisible_by: int = 128) -> ModelConfig:
    """Our ModelConfig for a supported HF config; ValueError (one line) names what cannot be expressed."""
    get = (hf_config.get if isinstance(hf_config, dict) else lambda k, d=None: getattr(hf_config, k, d))
    model_type = get("model_type")
    if model_type not in SUPPORTED:
        if model_type is None:
            lack = "config.json names no model_type"
        elif model_type in MISSING_FEATURES:
            lack = f"our Megatron model has no {MISSING_FEATURES[model_type]}"
        else:
            lack = "not an architecture this importer maps"
        raise ValueError(f"cannot import model_type {model_type!r}: {lack}; supported: {supported_list()}")
    problems = []
    if get("hidden_act", "silu") != "silu":
        problems.append(f"hidden_act={get('hidden_act')!r} (need silu: SwiGLU)")
    if get("attention_bias", False) or get("mlp_bias", False):
        problems.append("biases on o_proj or the MLP (attention_bias/mlp_bias; only Qwen2's q/k/v biases map)")
    if float(get("partial_rotary_factor", 1.0) or 1.0) != 1.0:
        problems.append(f"partial rotary (partial_rotary_factor={get('partial_rotary_factor')})")
    sliding = _sliding_window(get, model_type)
    if sliding:
        problems.append(sliding)
    theta, rope_type, rope = hf_rope_parameters(get)
    if rope_type == "longrope":
        problems.append(LONGROPE_REASON)
    elif rope_type == "proportional":
        problems.append(f"rope_type 'proportional' (p-RoPE, partial_rotary_factor={rope.get('partial_rotary_factor')}"
                        "; the importer does not map it to model.rope_proportion)")
    elif rope_type not in ("default", "llama3"):
        problems.append(f"rope_type {rope_type!r} (import the unscaled model; set positions.rope_scaling "
                        "for evaluation instead)")
    if problems:
        raise ValueError(f"cannot import model_type {model_type!r}: " + "; ".join(problems)
                         + f"; supported: {supported_list()}")

    def need(key: str, source: dict | None = None, where: str = "config.json"):
        value = get(key) if source is None else source.get(key)
        if value is None:
            raise ValueError(f"cannot import model_type {model_type!r}: {where} has no {key}")
        return value

    heads = int(need("num_attention_heads"))
    llama3 = {}
    if rope_type == "llama3":
        where = "its llama3 rope_scaling"
        llama3 = dict(use_rope_scaling=True, rope_scaling_factor=float(need("factor", rope, where)),
                      rope_scaling_low_freq_factor=float(need("low_freq_factor", rope, where)),
                      rope_scaling_high_freq_factor=float(need("high_freq_factor", rope, where)),
                      rope_scaling_original_max_position_embeddings=int(
                          need("original_max_position_embeddings", rope, where)))
    return ModelConfig(
        num_layers=int(need("num_hidden_layers")), hidden_size=int(need("hidden_size")),
        ffn_hidden_size=int(need("intermediate_size")), num_attention_heads=heads,
        num_query_groups=int(get("num_key_value_heads") or heads),
        kv_channels=int(get("head_dim") or int(need("hidden_size")) // heads),
        # Our exports announce the served length there (pretrain.hf.context) and record the window apart.
        seq_length=int(seq_length or (get("posaug_training") or {}).get("train_seq_length")
                       or need("max_position_embeddings")), vocab_size=int(need("vocab_size")),
        make_vocab_size_divisible_by=make_vocab_size_divisible_by, rotary_base=theta,
        rotary_interleaved=False, layernorm_epsilon=float(need("rms_norm_eps")),
        init_method_std=float(get("initializer_range", 0.02)),
        untie_embeddings_and_output_weights=not bool(get("tie_word_embeddings", False)),
        add_qkv_bias=model_type == "qwen2", **llama3)


def _tokenizer_record(hf_dir: Path, hf_config: dict, output: Path) -> dict[str, Any]:
    """train_state entries for the HF tokenizer files the run keeps (final paths under output/tokenizer)."""
    names = [n for n in TOKENIZER_FILES if (hf_dir / n).is_file()]
    record: dict[str, Any] = {"hf_token_ids": {k: hf_config.get(k) for k in SPECIAL_TOKEN_IDS}}
    if names:
        record["hf_tokenizer_dir"] = str((output / "tokenizer").resolve())
    for usable in ("tokenizer.json", "tokenizer.model"):  # what data_prep can load for fine-tuning
        if usable in names:
            record["tokenizer_path"] = str((output / "tokenizer" / usable).resolve())
            break
    return record


def _copy_side_files(hf_dir: Path, target: Path) -> None:
    copy_tokenizer_files(hf_dir, target)
    if (hf_dir / "generation_config.json").is_file():
        target.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(hf_dir / "generation_config.json", target / "generation_config.json")


def import_hf(hf_dir: str | Path, output: str | Path, *, tensor_parallel: int = 1, pipeline_parallel: int = 1,
              seq_length: int | None = None, overrides: list[str] | None = None, seed: int = 1234,
              overwrite: bool = False) -> Path:
    """Collective: write a supported HF directory as our checkpoint (iteration 0) under TP/PP."""
    import torch.distributed as dist

    from pretrain.trainer import checkpoint as ckpt
    from pretrain.trainer import config as config_module
    from pretrain.trainer import distributed
    from pretrain.trainer.engine import Engine

    hf_dir, output = Path(hf_dir), Path(output)
    check_apart(output, {"--hf": hf_dir})
    if not (hf_dir / "config.json").is_file():
        raise FileNotFoundError(f"{hf_dir}: no config.json (expected a Hugging Face model directory)")
    from pretrain.trainer.config_values import read_json

    try:
        hf_config = read_json(hf_dir / "config.json", "Hugging Face config")
    except ValueError as error:
        raise ValueError(f"{error}; download it again") from None
    if not isinstance(hf_config, dict):
        raise ValueError(f"{hf_dir / 'config.json'} holds a {type(hf_config).__name__}, not a config mapping")
    model_config = model_config_from_hf(hf_config, seq_length=seq_length)
    raw = {"name": output.name, "seed": seed, "model": config_module.plain_fields(model_config),
           "parallel": {"tensor_model_parallel_size": tensor_parallel,
                        "pipeline_model_parallel_size": pipeline_parallel},
           "checkpoint": {"load": str(output)}}
    train_config = config_module.from_dict(config_module.apply_overrides(raw, overrides or []))
    train_config.parallel.check_model(train_config.model)
    train_config.model.check_positions(train_config.positions.strategy, train_config.positions.rope_scaling)
    check_output(output, overwrite)
    # Every rank reads (and so validates) the weights before any directory is touched.
    full = hf_to_megatron_names(read_hf_weights(hf_dir), train_config.model,
                                train_config.model.padded_vocab_size(tensor_parallel))

    owns_world = not dist.is_initialized()
    if owns_world:
        distributed.initialize(train_config.parallel, seed)
    tmp = output.with_name(output.name + ".tmp-import")
    try:
        from megatron.core import parallel_state as ps

        if (ps.get_tensor_model_parallel_world_size(), ps.get_pipeline_model_parallel_world_size()) != \
                (tensor_parallel, pipeline_parallel):
            raise RuntimeError(f"the process groups are TP={ps.get_tensor_model_parallel_world_size()}/"
                               f"PP={ps.get_pipeline_model_parallel_world_size()}, not the requested "
                               f"TP={tensor_parallel}/PP={pipeline_parallel}")
        engine = Engine(train_config.model, train_config.parallel, train_config.optimizer, train_iters=1)
        module = engine.model.module
        local_names = [k for k, v in module.state_dict().items() if torch.is_tensor(v) and "_extra_state" not in k]
        layers_per_stage = train_config.model.num_layers // pipeline_parallel
        local = shard_for_rank(full, local_names, train_config.model, tp_rank=ps.get_tensor_model_parallel_rank(),
                               tp_size=tensor_parallel,
                               first_layer=ps.get_pipeline_model_parallel_rank() * layers_per_stage)
        with torch.no_grad():
            for name, tensor in module.state_dict().items():
                if name in local:
                    if tensor.shape != local[name].shape:
                        raise ValueError(f"{name}: HF weight gives shape {tuple(local[name].shape)}, "
                                         f"the model expects {tuple(tensor.shape)}")
                    tensor.copy_(local[name].to(tensor.dtype))
        if hasattr(engine.optimizer, "reload_model_params"):
            engine.optimizer.reload_model_params()  # fp32 main copies of bf16 weights
        state = {"config": config_module.to_dict(train_config), "consumed_samples": 0,
                 "imported_from": str(hf_dir.resolve()), **_tokenizer_record(hf_dir, hf_config, output)}
        # a write fault (also the one ckpt.save describes for training runs) is told in import-hf's terms
        with naming_output(output, what="the imported checkpoint", done=f"removed the partial {tmp.name}",
                           elsewhere="pass an --output on a larger disk",
                           then="rerun the same command (an existing --overwrite target is replaced only at the end)"):
            if dist.get_rank() == 0:
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir(parents=True)
                _copy_side_files(hf_dir, tmp / "tokenizer")
            dist.barrier()
            ckpt.save(tmp, 0, engine, state, keep_last=1)
            if dist.get_rank() == 0:
                (tmp / "config.yaml").write_text(config_module.dump(train_config))
                publish(tmp, output)
            dist.barrier()
    except BaseException:
        if dist.get_rank() == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if owns_world:
            distributed.destroy()
    return output


def import_cli(argv: list[str]) -> int:
    """`python -m pretrain import-hf`: Llama / Mistral / Qwen2 HF directory -> our checkpoint (torchrun for TP×PP > 1)."""
    from pretrain.hf.arguments import import_parser

    args = import_parser().parse_args(argv)
    try:
        path = import_hf(args.hf, args.output, tensor_parallel=args.tensor_model_parallel_size,
                         pipeline_parallel=args.pipeline_model_parallel_size, seq_length=args.seq_length,
                         overrides=args.overrides, seed=args.seed, overwrite=args.overwrite)
    except (ValueError, FileNotFoundError, FileExistsError, RuntimeError) as error:
        print(f"import-hf: error: {error}", file=sys.stderr)
        return 2
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"wrote {path}; fine-tune with: python -m pretrain train --config {path}/config.yaml "
              f"--set checkpoint.load={path} --set checkpoint.save=<new run dir> --set positions.strategy=posaug")
    return 0
