"""Hugging Face export: our checkpoint (any TP/PP) -> a `LlamaForCausalLM` directory.

A model with q/k/v biases (an imported Qwen2, model.add_qkv_bias) exports as `Qwen2ForCausalLM`,
the one HF type with exactly those biases; a model with Llama 3 RoPE scaling ships it as
config.json's rope_scaling (pretrain.hf.rope). p-RoPE exports as Llama with rope_type "proportional",
which needs transformers >= 5.5 (refused in one line before, pretrain.hf.support); NoPE-interleaved
models export as Llama 4 text (pretrain.hf.llama4).

The directory is built next to the target and moved into place only when complete, so a
failed export never leaves a half-written or emptied output. Weight names come from
`weight_map.WEIGHT_MAP`, RoPE fields from `rope`, the tokenizer's files from `export_tokenizer`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import torch

from pretrain.faults import human_bytes, naming_output
from data_prep.overlap import check_apart
from megatron_ext.model import ModelConfig
from megatron_ext.positions import RopeScaling
from pretrain.hf.context import served_length
from pretrain.hf.model_card import model_card
from pretrain.hf.rope import exported_scaling_record, hf_rope_fields, rope_scaling_for
from pretrain.hf.export_tokenizer import TokenizerSource
from pretrain.hf.weight_map import megatron_to_hf_names

# Extra config.json field recording how the model was trained (strategy, window, ...).
TRAINING_METADATA_KEY = "posaug_training"


def check_exportable(model_config: ModelConfig) -> None:
    """Refuse architectures that HF Llama cannot express exactly (ValueError naming the field)."""
    from pretrain.hf.qwen3 import check_recipe_exportable, uses_qwen

    check_recipe_exportable(model_config)  # sinks and what no architecture expresses (pretrain.hf.qwen3)
    if uses_qwen(model_config):
        raise ValueError("cannot export: QK-norm / sliding-window layers (model.qk_layernorm, model.window_size) are "
                         "not Llama; `export-hf` writes them as Qwen3 / Qwen2 (pretrain.hf.qwen3)")
    if model_config.position_embedding_type != "rope":
        raise ValueError(f"cannot export: model.position_embedding_type={model_config.position_embedding_type!r}; "
                         "the HF Llama export needs rope (Llama has no other position encoding)")
    if getattr(model_config, "ssmax_scale", None) is not None:
        raise ValueError("cannot export: SSMax (model.ssmax_scale) has no transformers architecture that computes "
                         "the same logits; evaluate it with --backend megatron")
    if getattr(model_config, "no_rope_freq", None) is not None:
        raise ValueError("cannot export: NoPE-interleaved layers (model.no_rope_freq) are not Llama; `export-hf` "
                         "writes them as Llama 4 text (pretrain.hf.llama4), the megatron backend scores them")
    if model_config.rotary_interleaved:
        raise ValueError("cannot export: the checkpoint was trained with interleaved RoPE "
                         "(model.rotary_interleaved=true); HF Llama's rotate_half matches only "
                         "Megatron's default non-interleaved RoPE")
    if getattr(model_config, "rope_proportion", 1.0) < 1.0:
        from pretrain.hf.support import check_proportional_rope

        check_proportional_rope(model_config.rope_proportion)  # transformers >= 5.5 (pretrain.hf.support)


def check_exportable_to_any(model_config: ModelConfig) -> None:
    """Refuse what no export target (Llama / Qwen2, or Llama 4 text for NoPE-interleaved layers) expresses."""
    from pretrain.hf.qwen3 import check_recipe_exportable, uses_qwen

    check_recipe_exportable(model_config)
    if uses_qwen(model_config):
        return
    if getattr(model_config, "no_rope_freq", None) is not None:
        from pretrain.hf.llama4 import check_llama4_exportable

        check_llama4_exportable(model_config)
        return
    check_exportable(model_config)


def hf_model_type(model_config: ModelConfig) -> str:
    """The transformers model_type an export writes: qwen2 for q/k/v biases, else llama."""
    return "qwen2" if model_config.add_qkv_bias else "llama"


def llama_config(model_config: ModelConfig, vocab_size: int, rope_scaling: RopeScaling | None = None,
                 **extra: Any):
    """`LlamaConfig` (`Qwen2Config` with q/k/v biases) with our architecture and RoPE (both transformers layouts)."""
    from transformers import LlamaConfig, Qwen2Config

    check_exportable(model_config)
    rope = hf_rope_fields(model_config, rope_scaling)
    # 4.x reads rope_theta/rope_scaling and keeps rope_parameters as a plain attribute; 5.x reads
    # rope_parameters and folds the (non-null) rope_scaling/rope_theta kwargs into it.
    defaults = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)
    if hf_model_type(model_config) == "qwen2":
        # Qwen2 has q/k/v biases built in (no attention_bias/mlp_bias fields); full attention in every layer.
        return Qwen2Config(
            vocab_size=int(vocab_size), hidden_size=model_config.hidden_size,
            intermediate_size=model_config.ffn_hidden_size, num_hidden_layers=model_config.num_layers,
            num_attention_heads=model_config.num_attention_heads, num_key_value_heads=model_config.num_query_groups,
            head_dim=model_config.kv_channels, hidden_act="silu", rms_norm_eps=model_config.layernorm_epsilon,
            tie_word_embeddings=not model_config.untie_embeddings_and_output_weights, use_sliding_window=False,
            attention_dropout=0.0, initializer_range=model_config.init_method_std, **rope, **{**defaults, **extra})
    return LlamaConfig(
        vocab_size=int(vocab_size),
        hidden_size=model_config.hidden_size,
        intermediate_size=model_config.ffn_hidden_size,
        num_hidden_layers=model_config.num_layers,
        num_attention_heads=model_config.num_attention_heads,
        num_key_value_heads=model_config.num_query_groups,
        head_dim=model_config.kv_channels,
        hidden_act="silu",
        rms_norm_eps=model_config.layernorm_epsilon,
        tie_word_embeddings=not model_config.untie_embeddings_and_output_weights,
        attention_bias=False,
        mlp_bias=False,
        attention_dropout=0.0,
        initializer_range=model_config.init_method_std,
        **rope,
        **{**defaults, **extra},
    )


def _plain_state(model_or_state) -> dict[str, torch.Tensor]:
    """Tensor entries of a model's (or DDP wrapper's) state dict, without `_extra_state`."""
    if isinstance(model_or_state, torch.nn.Module):
        state = getattr(model_or_state, "module", model_or_state).state_dict()
    else:
        state = dict(model_or_state)
    return {name.removeprefix("module."): value for name, value in state.items()
            if "_extra_state" not in name and torch.is_tensor(value)}


def megatron_state_to_llama(state: dict[str, torch.Tensor], model_config: ModelConfig,
                            vocab_size: int | None = None) -> dict[str, torch.Tensor]:
    """HF Llama / Qwen2 state dict (float32) from a TP=1/PP=1 Megatron state dict (vocabulary padding trimmed)."""
    check_exportable(model_config)
    vocab = model_config.vocab_size if vocab_size is None else int(vocab_size)
    out = megatron_to_hf_names(_plain_state(state), model_config, vocab)
    return {k: v.detach().to(torch.float32).contiguous() for k, v in out.items()}


def megatron_to_llama(model, model_config: ModelConfig, *, vocab_size: int | None = None,
                      rope_scaling: RopeScaling | None = None, **extra: Any):
    """In-memory float32 `LlamaForCausalLM` / `Qwen2ForCausalLM` (sdpa) with a TP=1/PP=1 model's weights."""
    from transformers import AutoModelForCausalLM

    vocab = model_config.vocab_size if vocab_size is None else int(vocab_size)
    weights = megatron_state_to_llama(_plain_state(model), model_config, vocab)
    config = llama_config(model_config, vocab, rope_scaling, **extra)
    with torch.device("cpu"):
        hf = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    hf = hf.to(torch.float32)
    missing, unexpected = hf.load_state_dict(weights, strict=False)
    # With tied embeddings lm_head.weight is the embedding itself.
    missing = [m for m in missing if not (m == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise RuntimeError(f"weight mapping mismatch: missing {missing}, unexpected {unexpected}")
    if config.tie_word_embeddings:
        hf.tie_weights()
    return hf.eval()


def training_metadata(record: dict, train_config, rope_scaling: RopeScaling | None) -> dict:
    """What config.json records about training (strategy, positions section, window, progress)."""
    from pretrain.trainer.config import plain_fields

    return {"strategy": train_config.positions.strategy, "positions": plain_fields(train_config.positions),
            "train_seq_length": train_config.model.seq_length,
            "iteration": record.get("iteration"), "consumed_samples": record.get("consumed_samples"),
            "exported_rope_scaling": exported_scaling_record(rope_scaling),
            "source": "megatron-core (pretrain.hf.export)"}


def _ensure_single_process():
    """Initialise a world of one (TP=PP=1) unless one exists; returns a teardown callable."""
    import torch.distributed as dist

    from megatron_ext.model import ParallelConfig
    from pretrain.trainer import distributed

    if dist.is_initialized():
        from megatron.core import parallel_state as ps

        if ps.model_parallel_is_initialized() and (ps.get_tensor_model_parallel_world_size() > 1
                                                   or ps.get_pipeline_model_parallel_world_size() > 1):
            raise RuntimeError("export-hf gathers on one process: run it without torchrun (TP=PP=1)")
        if not ps.model_parallel_is_initialized():
            distributed.initialize(ParallelConfig(), seed=0)
        return lambda: None
    distributed.initialize(ParallelConfig(), seed=0)
    return distributed.destroy


def load_checkpoint_state(checkpoint: str | Path) -> tuple[dict[str, torch.Tensor], Any, dict]:
    """(TP=1/PP=1 state dict, TrainConfig, train_state record) of a checkpoint saved with any TP/PP."""
    from megatron_ext.model import ParallelConfig, build_model
    from pretrain.trainer import checkpoint as ckpt
    from pretrain.trainer import config as config_module

    record = ckpt.read_train_state(checkpoint)
    train_config = config_module.from_dict(record["config"])
    check_exportable_to_any(train_config.model)
    teardown = _ensure_single_process()
    try:
        model = build_model(train_config.model, ParallelConfig())
        ckpt.load_model_weights(checkpoint, model)  # dist_checkpointing reshards any TP/PP to TP=PP=1
        state = {k: v.detach().clone() for k, v in _plain_state(model).items()}
    finally:
        teardown()
    return state, train_config, record


def check_output(output: Path, overwrite: bool) -> None:
    """FileExistsError unless `output` is absent, empty, or --overwrite was given."""
    if output.exists() and (not output.is_dir() or any(output.iterdir())) and not overwrite:
        raise FileExistsError(f"output {output} exists and is not empty; pass --overwrite to replace it")


def publish(tmp: Path, output: Path) -> None:
    """Move a finished directory into place (the old one is removed only now)."""
    if output.exists():
        shutil.rmtree(output) if output.is_dir() else output.unlink()
    os.replace(tmp, output)


def drope_dropped(train_config, record: dict):
    """The ModelConfig a recalibrated DroPE checkpoint runs as (every layer NoPE, Llama 4 text), None for any other
    checkpoint (a DroPE one still in pretraining is its RoPE model); ValueError for what Llama 4 cannot express."""
    from megatron_ext.positions.drope import run_phase

    if run_phase(train_config.positions, record.get("iteration"), train_config.train_iters()) != "recalibration":
        return None
    from pretrain.hf.llama4 import check_llama4_exportable
    from pretrain.hf.qwen3 import uses_qwen

    model = train_config.model
    if uses_qwen(model):
        raise ValueError("cannot export: a DroPE model with QK-norm (model.qk_layernorm) has no transformers "
                         "architecture without RoPE (Llama 4 text has no per-head q/k RMSNorm; Qwen3 has no NoPE "
                         "layers)")
    if model.attn_temperature_tuning:
        raise ValueError("cannot export: a DroPE model with attention temperature (model.attn_temperature_tuning) "
                         "would get Llama 4's temperature on every layer, not only its NoPE-interleaved ones")
    check_llama4_exportable(model)
    return dataclasses.replace(model, no_rope_freq=1)


def export_checkpoint(checkpoint: str | Path, output: str | Path, *, tokenizer: str | None = None,
                      no_tokenizer: bool = False, rope_scaling: str | None = None, factor: float | None = None,
                      eval_length: int | None = None, max_shard_size: str | int = "2GB",
                      dtype: str = "float32", overwrite: bool = False,
                      max_position_embeddings: int | None = None) -> Path:
    """Write a `LlamaForCausalLM` / `Qwen2ForCausalLM` directory (config, safetensors, generation config, tokenizer, README)."""
    from transformers import GenerationConfig

    from pretrain.trainer import checkpoint as ckpt
    from pretrain.trainer import config as config_module

    output = Path(output)
    check_apart(output, {"the run directory": checkpoint, "the checkpoint's run directory": ckpt.resolve(checkpoint).parent,
                         "--tokenizer": tokenizer})
    check_output(output, overwrite)
    record = ckpt.read_train_state(checkpoint)
    train_config = config_module.from_dict(record["config"])
    nope_interleaved = train_config.model.no_rope_freq is not None  # → Llama 4 text (pretrain.hf.llama4)
    check_exportable_to_any(train_config.model)
    dropped = drope_dropped(train_config, record)  # a recalibrated DroPE model → Llama 4 text, every layer NoPE
    source = TokenizerSource(record, ckpt.resolve(checkpoint).parent, tokenizer, no_tokenizer,
                              train_config.model.vocab_size)
    scaling = rope_scaling_for(train_config, kind=rope_scaling, factor=factor, eval_length=eval_length)
    rope_fields = hf_rope_fields(train_config.model, scaling)
    # The length tools size their context from (pretrain.hf.context); RoPE numerics stay rope_fields'.
    rope_fields["max_position_embeddings"] = served_length(train_config, scaling, rope_fields,
                                                           eval_length=eval_length, override=max_position_embeddings)

    state, train_config, record = load_checkpoint_state(checkpoint)
    metadata = training_metadata(record, train_config, scaling)
    from pretrain.hf.qwen3 import megatron_to_qwen, uses_qwen

    if dropped is not None:
        from pretrain.hf.llama4 import megatron_to_llama4

        if scaling is not None:
            raise ValueError("cannot export RoPE scaling for a DroPE model: it has no RoPE after its recalibration; "
                             "drop --rope-scaling")
        hf = megatron_to_llama4(state, dropped, **source.ids, **{TRAINING_METADATA_KEY: metadata})
    elif uses_qwen(train_config.model):  # QK-norm / sliding windows → Qwen3 / Qwen2 (pretrain.hf.qwen3)
        hf = megatron_to_qwen(state, train_config.model, rope_scaling=scaling, **source.ids,
                              **{TRAINING_METADATA_KEY: metadata})
    elif nope_interleaved:
        from pretrain.hf.llama4 import megatron_to_llama4

        if scaling is not None:
            raise ValueError("cannot export RoPE scaling with NoPE-interleaved layers (Llama 4 text): drop "
                             "--rope-scaling")
        hf = megatron_to_llama4(state, train_config.model, **source.ids, **{TRAINING_METADATA_KEY: metadata})
    else:
        hf = megatron_to_llama(state, train_config.model, rope_scaling=scaling, **source.ids,
                               **{TRAINING_METADATA_KEY: metadata})
    hf.generation_config = GenerationConfig(do_sample=False, **{k: v for k, v in source.ids.items() if v is not None})
    hf = hf.to(getattr(torch, dtype))

    tmp = output.with_name(output.name + ".tmp-export")
    weights = sum(t.numel() * t.element_size() for t in hf.state_dict().values())
    try:
        with naming_output(output, what="the Hugging Face export", needed=f"about {human_bytes(weights)} of weights",
                           done=f"removed the partial {tmp.name}", elsewhere="pass an --output on a larger disk",
                           then="rerun the same command (an existing --overwrite target is replaced only at the end)"):
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            hf.save_pretrained(tmp, max_shard_size=max_shard_size)
            # transformers 5.x serialises only rope_parameters: add the 4.x fields (see pretrain.hf.rope).
            config_file = tmp / "config.json"
            config = json.loads(config_file.read_text())
            config.update(rope_fields)
            config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
            source.write(tmp)
            (tmp / "README.md").write_text(model_card(train_config, record, scaling, eval_length,
                                                        rope_fields["max_position_embeddings"]))
            publish(tmp, output)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return output


def export_cli(argv: list[str]) -> int:
    """`python -m pretrain export-hf`: checkpoint (any TP/PP) -> Hugging Face Llama (or Qwen2) directory."""
    from pretrain.hf.arguments import export_parser

    parser = export_parser()
    args = parser.parse_args(argv)
    if getattr(args, "checkpoint", None) is None:
        parser.error("the run to export is missing: python -m pretrain export-hf RUN --output DIR")
    try:
        path = export_checkpoint(args.checkpoint, args.output, tokenizer=args.tokenizer,
                                 no_tokenizer=args.no_tokenizer, rope_scaling=args.rope_scaling,
                                 factor=args.factor, eval_length=args.eval_length,
                                 max_shard_size=args.max_shard_size, dtype=args.dtype, overwrite=args.overwrite,
                                 max_position_embeddings=args.max_position_embeddings)
    except (ValueError, FileNotFoundError, FileExistsError, RuntimeError) as error:
        print(f"export-hf: error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {path} (load with transformers.AutoModelForCausalLM.from_pretrained({str(path)!r}))")
    return 0
