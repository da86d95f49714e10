"""Hugging Face export (Megatron GPT -> `LlamaForCausalLM`) and import (Llama -> our checkpoint).

Weight layout (TP=1/PP=1 state dict of `FloatPositionGPTModel`, local or TE spec):

- `self_attention.linear_qkv.weight` is grouped per query group: rows
  `[q_0 .. q_{h/g-1}, k, v]` for group 0, then group 1, ...; split into q/k/v_proj.
- `mlp.linear_fc1.weight` is `[gate; up]` (SwiGLU); split into gate_proj / up_proj.
- Megatron's default (non-interleaved) RoPE rotates halves exactly like HF's
  `rotate_half`, so q/k rows need no permutation; interleaved RoPE is refused.
- The embedding (and untied output layer) carry vocabulary padding; it is trimmed.

HF Llama computes `inv_freq @ position_ids.float()`, so fractional positions can be
passed as `position_ids`; pass an all-ones `attention_mask` too (`hf_logits` does), or
transformers reads non-unit position gaps as packed sequences and masks across them.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

import torch

from megatron_ext.model import ModelConfig

# Extra config.json field recording how the model was trained (strategy, window, ...).
TRAINING_METADATA_KEY = "posaug_training"


def _check_exportable(model_config: ModelConfig) -> None:
    """Refuse architectures that HF Llama cannot express exactly."""
    if model_config.rotary_interleaved:
        raise ValueError("cannot export: the checkpoint was trained with interleaved RoPE "
                         "(model.rotary_interleaved=true); HF Llama's rotate_half matches only "
                         "Megatron's default non-interleaved RoPE")


def llama_config(model_config: ModelConfig, vocab_size: int, rope_scaling: dict | None = None,
                 **extra: Any):
    """`LlamaConfig` with our architecture; rope_scaling is an HF rope dict ({'rope_type': ...})."""
    from transformers import LlamaConfig

    _check_exportable(model_config)
    rope = {"rope_type": "default", "rope_theta": float(model_config.rotary_base)}
    max_positions = model_config.seq_length
    if rope_scaling:
        rope = {**rope, **{k: v for k, v in rope_scaling.items() if k != "type"}}
        rope["rope_type"] = rope_scaling.get("rope_type", rope_scaling.get("type"))
        if rope["rope_type"] == "yarn":
            rope.setdefault("original_max_position_embeddings", model_config.seq_length)
            # HF checks factor == max_position_embeddings / original window.
            max_positions = int(round(rope["original_max_position_embeddings"] * float(rope["factor"])))
    defaults = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None,
                    max_position_embeddings=max_positions)
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
        rope_parameters=rope,
        tie_word_embeddings=not model_config.untie_embeddings_and_output_weights,
        attention_bias=False,
        mlp_bias=False,
        attention_dropout=0.0,
        initializer_range=model_config.init_method_std,
        **{**defaults, **extra},
    )


def _plain_state(model_or_state) -> dict[str, torch.Tensor]:
    """Tensor entries of a model's (or DDP wrapper's) state dict, without `_extra_state`."""
    if isinstance(model_or_state, torch.nn.Module):
        module = getattr(model_or_state, "module", model_or_state)
        state = module.state_dict()
    else:
        state = dict(model_or_state)
    out = {}
    for name, value in state.items():
        if name.startswith("module."):
            name = name[len("module."):]
        if "_extra_state" in name or not torch.is_tensor(value):
            continue
        out[name] = value
    return out


def _first(state: dict, *names: str) -> torch.Tensor:
    for name in names:
        if name in state:
            return state[name]
    raise KeyError(f"none of {names} in the Megatron state dict")


def split_qkv(qkv: torch.Tensor, model_config: ModelConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Megatron grouped QKV rows [g × (q..., k, v)] -> (q_proj, k_proj, v_proj) weights."""
    heads, groups, d = model_config.num_attention_heads, model_config.num_query_groups, model_config.kv_channels
    per_group = heads // groups
    grouped = qkv.reshape(groups, per_group + 2, d, qkv.shape[-1])
    q = grouped[:, :per_group].reshape(heads * d, -1)
    k = grouped[:, per_group].reshape(groups * d, -1)
    v = grouped[:, per_group + 1].reshape(groups * d, -1)
    return q, k, v


def merge_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, model_config: ModelConfig) -> torch.Tensor:
    """Inverse of `split_qkv`."""
    heads, groups, d = model_config.num_attention_heads, model_config.num_query_groups, model_config.kv_channels
    per_group = heads // groups
    h = q.shape[-1]
    grouped = torch.cat([q.reshape(groups, per_group, d, h), k.reshape(groups, 1, d, h),
                         v.reshape(groups, 1, d, h)], dim=1)
    return grouped.reshape(-1, h)


def megatron_state_to_llama(state: dict[str, torch.Tensor], model_config: ModelConfig,
                            vocab_size: int | None = None) -> dict[str, torch.Tensor]:
    """HF Llama state dict from a TP=1/PP=1 Megatron state dict (vocabulary padding trimmed)."""
    _check_exportable(model_config)
    state = _plain_state(state)
    vocab = model_config.vocab_size if vocab_size is None else int(vocab_size)
    embedding = state["embedding.word_embeddings.weight"]
    if vocab > embedding.shape[0]:
        raise ValueError(f"vocab_size {vocab} exceeds the checkpoint's embedding rows {embedding.shape[0]}")
    out = {"model.embed_tokens.weight": embedding[:vocab]}
    f = model_config.ffn_hidden_size
    for i in range(model_config.num_layers):
        p, o = f"decoder.layers.{i}.", f"model.layers.{i}."
        # Local spec keeps separate norms; the TE spec fuses them into the following linear.
        out[o + "input_layernorm.weight"] = _first(
            state, p + "input_layernorm.weight", p + "self_attention.linear_qkv.layer_norm_weight")
        out[o + "post_attention_layernorm.weight"] = _first(
            state, p + "pre_mlp_layernorm.weight", p + "mlp.linear_fc1.layer_norm_weight")
        q, k, v = split_qkv(state[p + "self_attention.linear_qkv.weight"], model_config)
        out[o + "self_attn.q_proj.weight"] = q
        out[o + "self_attn.k_proj.weight"] = k
        out[o + "self_attn.v_proj.weight"] = v
        out[o + "self_attn.o_proj.weight"] = state[p + "self_attention.linear_proj.weight"]
        fc1 = state[p + "mlp.linear_fc1.weight"]
        if fc1.shape[0] != 2 * f:
            raise ValueError(f"cannot export: layer {i} mlp.linear_fc1 has {fc1.shape[0]} rows, expected "
                             f"2 × ffn_hidden_size = {2 * f} (the model must be SwiGLU)")
        out[o + "mlp.gate_proj.weight"] = fc1[:f]
        out[o + "mlp.up_proj.weight"] = fc1[f:]
        out[o + "mlp.down_proj.weight"] = state[p + "mlp.linear_fc2.weight"]
    out["model.norm.weight"] = state["decoder.final_layernorm.weight"]
    if model_config.untie_embeddings_and_output_weights:
        out["lm_head.weight"] = state["output_layer.weight"][:vocab]
    return {k: v.detach().to(torch.float32).contiguous() for k, v in out.items()}


def megatron_to_llama(model, model_config: ModelConfig, *, vocab_size: int | None = None,
                      rope_scaling: dict | None = None, **extra: Any):
    """In-memory float32 `LlamaForCausalLM` (sdpa) with the weights of a TP=1/PP=1 model or state dict."""
    from transformers import LlamaForCausalLM

    vocab = model_config.vocab_size if vocab_size is None else int(vocab_size)
    weights = megatron_state_to_llama(_plain_state(model), model_config, vocab)
    config = llama_config(model_config, vocab, rope_scaling, **extra)
    config._attn_implementation = "sdpa"
    with torch.device("cpu"):
        hf = LlamaForCausalLM(config)
    hf = hf.to(torch.float32)
    missing, unexpected = hf.load_state_dict(weights, strict=False)
    # With tied embeddings lm_head.weight is the embedding itself.
    missing = [m for m in missing if not (m == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise RuntimeError(f"weight mapping mismatch: missing {missing}, unexpected {unexpected}")
    if config.tie_word_embeddings:
        hf.tie_weights()
    return hf.eval()


def hf_logits(hf_model, tokens: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
    """Logits of an HF causal LM at (possibly fractional) positions [s] or [b, s]."""
    if positions is not None:
        positions = positions.to(torch.float32)
        if positions.dim() == 1:
            positions = positions[None].expand(tokens.shape[0], -1)
    # An explicit mask stops transformers from treating non-unit position gaps as packing.
    mask = torch.ones_like(tokens)
    with torch.no_grad():
        return hf_model(input_ids=tokens, attention_mask=mask, position_ids=positions, use_cache=False).logits


# ----------------------------------------------------------------------------- tokenizer


def sentencepiece_to_tokenizers(model_file: str):
    """A `tokenizers.Tokenizer` that encodes like the SentencePiece `.model` (BPE or unigram)."""
    from sentencepiece import sentencepiece_model_pb2
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE, Unigram
    from transformers.convert_slow_tokenizer import generate_merges

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
        merges = generate_merges(vocab, vocab_scores, skip_tokens=control)
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


def hf_tokenizer(tokenizer):
    """A `PreTrainedTokenizerFast` equivalent to our data_prep Tokenizer (hf, gpt2_bpe or sentencepiece)."""
    from tokenizers import Tokenizer as RustTokenizer
    from transformers import PreTrainedTokenizerFast

    if tokenizer.kind == "sentencepiece":
        rust = sentencepiece_to_tokenizers(tokenizer.path)
    else:
        rust = RustTokenizer.from_str(tokenizer._tok.to_str())
    if tokenizer.kind == "sentencepiece":
        import sentencepiece as spm

        sp = spm.SentencePieceProcessor(model_file=tokenizer.path)
        eos = sp.id_to_piece(tokenizer.eod)
        pad = sp.id_to_piece(tokenizer.pad)
        bos = sp.id_to_piece(sp.bos_id()) if sp.bos_id() >= 0 else eos
        unk = sp.id_to_piece(sp.unk_id()) if sp.unk_id() >= 0 else None
    else:
        eos, pad = rust.id_to_token(tokenizer.eod), rust.id_to_token(tokenizer.pad)
        bos, unk = eos, None  # GPT-2 convention: <|endoftext|> is bos and eos
    # Our encoder adds no special tokens; no post-processor keeps HF the same.
    # Our SentencePiece and GPT-2 encoders read a literal "</s>" / "<|endoftext|>" in text as
    # characters; a tokenizer.json keeps its own added-token behaviour.
    return PreTrainedTokenizerFast(tokenizer_object=rust, bos_token=bos, eos_token=eos, pad_token=pad,
                                   unk_token=unk, clean_up_tokenization_spaces=False,
                                   split_special_tokens=tokenizer.kind != "hf")


# ----------------------------------------------------------------------------- positions


HF_SCALING_KINDS = ("none", "linear", "yarn", "dynamic")


def rope_scaling_for(train_config, *, kind: str | None = None, factor: float | None = None,
                     eval_length: int | None = None) -> dict | None:
    """HF rope dict that reproduces the run's evaluation positions (None = plain RoPE).

    posaug / rpe / warp / random_base / none evaluate with plain RoPE (alpha = 1, the base
    B0), so they export without scaling unless `kind` asks for one (e.g. PosAug + YaRN).
    RFS evaluates at L(2i - 1) / (2M), M = max(n_train, n_eval): the constant L / (2M)
    cancels in RoPE's relative rotation, leaving positions (i - 1) L / M, i.e. HF linear
    scaling with factor M / L (HF divides positions by the factor).
    """
    kind = None if kind in (None, "none") else kind
    if kind is not None and kind not in HF_SCALING_KINDS:
        raise ValueError(f"--rope-scaling must be one of {', '.join(HF_SCALING_KINDS)} (got {kind!r})")
    positions, n_train = train_config.positions, train_config.model.seq_length
    if positions.strategy == "rfs":
        if kind is not None:
            raise ValueError("an RFS model exports the linear scaling that reproduces its evaluation "
                             "positions; --rope-scaling cannot be combined with it")
        m = max(n_train, eval_length or n_train)
        return {"rope_type": "linear", "factor": m / positions.max_position}
    if kind is None:
        return None
    if factor is None or factor < 1:
        raise ValueError(f"--rope-scaling {kind} needs --factor >= 1 (got {factor})")
    scaling = {"rope_type": kind, "factor": float(factor)}
    if kind in ("yarn", "dynamic"):
        scaling["original_max_position_embeddings"] = n_train
    return scaling


def training_metadata(record: dict, train_config, rope_scaling: dict | None) -> dict:
    """What config.json records about training (strategy, positions section, window, progress)."""
    import dataclasses

    return {"strategy": train_config.positions.strategy,
            "positions": {k: list(v) if isinstance(v, tuple) else v
                          for k, v in dataclasses.asdict(train_config.positions).items()},
            "train_seq_length": train_config.model.seq_length,
            "iteration": record.get("iteration"), "consumed_samples": record.get("consumed_samples"),
            "exported_rope_scaling": rope_scaling, "source": "megatron-core (pretrain.hf.export)"}


# ----------------------------------------------------------------------------- export


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
    _check_exportable(train_config.model)
    teardown = _ensure_single_process()
    try:
        model = build_model(train_config.model, ParallelConfig())
        ckpt.load_model_weights(checkpoint, model)  # dist_checkpointing reshards any TP/PP to TP=PP=1
        state = {k: v.detach().clone() for k, v in _plain_state(model).items()}
    finally:
        teardown()
    return state, train_config, record


def resolve_tokenizer_path(record: dict, explicit: str | None = None) -> str | None:
    """--tokenizer, else the one recorded by import-hf, else the run's data manifest's; None if none."""
    if explicit:
        return explicit
    if record.get("tokenizer_path"):
        return record["tokenizer_path"]
    data_path = (record.get("config") or {}).get("data", {}).get("data_path")
    if data_path:
        from data_prep.manifest import load_manifest, manifest_path

        if Path(manifest_path(data_path)).is_file():
            return load_manifest(data_path).tokenizer_path
    return None


def _check_output(output: Path, overwrite: bool) -> None:
    if output.exists() and (not output.is_dir() or any(output.iterdir())) and not overwrite:
        raise FileExistsError(f"output {output} exists and is not empty; pass --overwrite to replace it")


def _publish(tmp: Path, output: Path) -> None:
    """Move a finished directory into place (the old one is removed only now)."""
    if output.exists():
        shutil.rmtree(output) if output.is_dir() else output.unlink()
    os.replace(tmp, output)


def export_checkpoint(checkpoint: str | Path, output: str | Path, *, tokenizer: str | None = None,
                      no_tokenizer: bool = False, rope_scaling: str | None = None, factor: float | None = None,
                      eval_length: int | None = None, max_shard_size: str | int = "2GB",
                      dtype: str = "float32", overwrite: bool = False) -> Path:
    """Write a `LlamaForCausalLM` directory (config, safetensors, generation config, tokenizer)."""
    from transformers import GenerationConfig

    from pretrain.trainer import checkpoint as ckpt
    from pretrain.trainer import config as config_module

    output = Path(output)
    _check_output(output, overwrite)
    record = ckpt.read_train_state(checkpoint)
    train_config = config_module.from_dict(record["config"])
    _check_exportable(train_config.model)
    tokenizer_path = None if no_tokenizer else resolve_tokenizer_path(record, tokenizer)
    if tokenizer_path is None and not no_tokenizer:
        raise ValueError("no tokenizer: the checkpoint records no data manifest with one; pass "
                         "--tokenizer PATH (tokenizer.json, a .model, or vocab.json+merges.txt dir), "
                         "or --no-tokenizer to export the model alone")
    tok = None
    if tokenizer_path is not None:
        from data_prep.tokenizers import load_tokenizer

        tok = load_tokenizer(tokenizer_path)
        if tok.vocab_size > train_config.model.vocab_size:
            raise ValueError(f"tokenizer {tokenizer_path} has {tok.vocab_size} tokens but the model only "
                             f"{train_config.model.vocab_size}: wrong tokenizer?")
    scaling = rope_scaling_for(train_config, kind=rope_scaling, factor=factor, eval_length=eval_length)

    state, train_config, record = load_checkpoint_state(checkpoint)
    ids = {}
    if tok is not None:
        ids = dict(eos_token_id=tok.eod, pad_token_id=tok.pad)
        if tok.kind == "sentencepiece":
            import sentencepiece as spm

            bos = spm.SentencePieceProcessor(model_file=tok.path).bos_id()
            ids["bos_token_id"] = bos if bos >= 0 else tok.eod
        else:
            ids["bos_token_id"] = tok.eod  # GPT-2 convention
    hf = megatron_to_llama(state, train_config.model, rope_scaling=scaling,
                           **ids, **{TRAINING_METADATA_KEY: training_metadata(record, train_config, scaling)})
    hf.generation_config = GenerationConfig(do_sample=False, **{k: v for k, v in ids.items() if v is not None})
    hf = hf.to(getattr(torch, dtype))

    tmp = output.with_name(output.name + ".tmp-export")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    hf.save_pretrained(tmp, max_shard_size=max_shard_size)
    if tok is not None:
        hf_tokenizer(tok).save_pretrained(tmp)
        if tok.kind == "sentencepiece":
            shutil.copyfile(tok.path, tmp / "tokenizer.model")  # for sentencepiece-based loaders
    _publish(tmp, output)
    return output


# ----------------------------------------------------------------------------- import


def read_hf_weights(hf_dir: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of an HF directory (model.safetensors or its sharded index)."""
    import json

    from safetensors.torch import load_file

    hf_dir = Path(hf_dir)
    index = hf_dir / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (hf_dir / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise FileNotFoundError(f"{hf_dir}: no model.safetensors or model.safetensors.index.json "
                                "(PyTorch .bin checkpoints are not read; re-save with safetensors)")
    state: dict[str, torch.Tensor] = {}
    for name in files:
        state.update(load_file(str(hf_dir / name)))
    return state


def model_config_from_llama(hf_config, *, seq_length: int | None = None,
                            make_vocab_size_divisible_by: int = 128) -> ModelConfig:
    """Our ModelConfig for a Llama-family config; refuses what our architecture cannot express."""
    get = (hf_config.get if isinstance(hf_config, dict) else lambda k, d=None: getattr(hf_config, k, d))
    problems = []
    if get("hidden_act", "silu") != "silu":
        problems.append(f"hidden_act={get('hidden_act')!r} (need silu: SwiGLU)")
    if get("attention_bias", False) or get("mlp_bias", False):
        problems.append("linear biases (attention_bias/mlp_bias)")
    if get("sliding_window") not in (None, 0) and get("use_sliding_window", True):
        problems.append(f"sliding_window={get('sliding_window')}")
    rope = dict(get("rope_parameters") or get("rope_scaling") or {})
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        problems.append(f"rope scaling {rope_type!r} (import the unscaled model; set positions.rope_scaling "
                        "for evaluation instead)")
    if problems:
        raise ValueError("cannot import: " + "; ".join(problems))
    heads = int(get("num_attention_heads"))
    theta = rope.get("rope_theta", get("rope_theta", 10000.0))
    return ModelConfig(
        num_layers=int(get("num_hidden_layers")), hidden_size=int(get("hidden_size")),
        ffn_hidden_size=int(get("intermediate_size")), num_attention_heads=heads,
        num_query_groups=int(get("num_key_value_heads") or heads),
        kv_channels=int(get("head_dim") or int(get("hidden_size")) // heads),
        seq_length=int(seq_length or get("max_position_embeddings")), vocab_size=int(get("vocab_size")),
        make_vocab_size_divisible_by=make_vocab_size_divisible_by, rotary_base=float(theta),
        rotary_interleaved=False, layernorm_epsilon=float(get("rms_norm_eps")),
        init_method_std=float(get("initializer_range", 0.02)),
        untie_embeddings_and_output_weights=not bool(get("tie_word_embeddings", False)))


def llama_state_to_megatron(hf_state: dict[str, torch.Tensor], model_config: ModelConfig,
                            padded_vocab_size: int | None = None) -> dict[str, torch.Tensor]:
    """TP=1/PP=1 Megatron state dict from an HF Llama state dict (vocabulary zero-padded)."""
    padded = padded_vocab_size or model_config.padded_vocab_size()

    def pad(weight: torch.Tensor) -> torch.Tensor:
        out = weight.new_zeros(padded, weight.shape[1])
        out[: weight.shape[0]] = weight
        return out

    out = {"embedding.word_embeddings.weight": pad(hf_state["model.embed_tokens.weight"])}
    for i in range(model_config.num_layers):
        p, o = f"decoder.layers.{i}.", f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = hf_state[o + "input_layernorm.weight"]
        out[p + "pre_mlp_layernorm.weight"] = hf_state[o + "post_attention_layernorm.weight"]
        out[p + "self_attention.linear_qkv.weight"] = merge_qkv(
            hf_state[o + "self_attn.q_proj.weight"], hf_state[o + "self_attn.k_proj.weight"],
            hf_state[o + "self_attn.v_proj.weight"], model_config)
        out[p + "self_attention.linear_proj.weight"] = hf_state[o + "self_attn.o_proj.weight"]
        out[p + "mlp.linear_fc1.weight"] = torch.cat([hf_state[o + "mlp.gate_proj.weight"],
                                                      hf_state[o + "mlp.up_proj.weight"]])
        out[p + "mlp.linear_fc2.weight"] = hf_state[o + "mlp.down_proj.weight"]
    out["decoder.final_layernorm.weight"] = hf_state["model.norm.weight"]
    if model_config.untie_embeddings_and_output_weights:
        out["output_layer.weight"] = pad(hf_state["lm_head.weight"])
    return out


def shard_for_rank(full: dict[str, torch.Tensor], local_names: list[str], model_config: ModelConfig,
                   *, tp_rank: int, tp_size: int, first_layer: int) -> dict[str, torch.Tensor]:
    """This rank's slices of a TP=1/PP=1 state dict, keyed by its local module's names."""
    f = model_config.ffn_hidden_size
    out = {}
    for name in local_names:
        global_name = name
        if name.startswith("decoder.layers."):
            parts = name.split(".")
            parts[2] = str(int(parts[2]) + first_layer)
            global_name = ".".join(parts)
        if global_name == "output_layer.weight" and global_name not in full:
            global_name = "embedding.word_embeddings.weight"  # tied: the last stage's copy
        weight = full[global_name]
        if global_name.endswith("mlp.linear_fc1.weight"):
            # Each TP shard holds [gate_r; up_r], not a contiguous slice of [gate; up].
            gate, up = weight[:f].chunk(tp_size)[tp_rank], weight[f:].chunk(tp_size)[tp_rank]
            weight = torch.cat([gate, up])
        elif global_name.endswith(("linear_qkv.weight", "word_embeddings.weight", "output_layer.weight")):
            weight = weight.chunk(tp_size, dim=0)[tp_rank]  # groups [q.., k, v] stay whole per shard
        elif global_name.endswith(("linear_proj.weight", "linear_fc2.weight")):
            weight = weight.chunk(tp_size, dim=1)[tp_rank]
        out[name] = weight
    return out


def import_hf(hf_dir: str | Path, output: str | Path, *, tensor_parallel: int = 1, pipeline_parallel: int = 1,
              seq_length: int | None = None, overrides: list[str] | None = None, seed: int = 1234,
              overwrite: bool = False) -> Path:
    """Collective: write a Llama-family HF directory as our checkpoint (iteration 0) under TP/PP."""
    import json

    import torch.distributed as dist

    from megatron_ext.model import ParallelConfig
    from pretrain.trainer import checkpoint as ckpt
    from pretrain.trainer import config as config_module
    from pretrain.trainer import distributed
    from pretrain.trainer.engine import Engine

    hf_dir, output = Path(hf_dir), Path(output)
    if not (hf_dir / "config.json").is_file():
        raise FileNotFoundError(f"{hf_dir}: no config.json (expected a Hugging Face model directory)")
    hf_config = json.loads((hf_dir / "config.json").read_text())
    model_config = model_config_from_llama(hf_config, seq_length=seq_length)
    raw = {"name": output.name, "seed": seed, "model": dataclasses_asdict(model_config),
           "parallel": {"tensor_model_parallel_size": tensor_parallel,
                        "pipeline_model_parallel_size": pipeline_parallel},
           "checkpoint": {"load": str(output)}}
    train_config = config_module.from_dict(config_module.apply_overrides(raw, overrides or []))
    train_config.parallel.check_model(train_config.model)
    tokenizer_json = hf_dir / "tokenizer.json"

    owns_world = not dist.is_initialized()
    if owns_world:
        distributed.initialize(train_config.parallel, seed)
    try:
        from megatron.core import parallel_state as ps

        if (ps.get_tensor_model_parallel_world_size(), ps.get_pipeline_model_parallel_world_size()) != \
                (tensor_parallel, pipeline_parallel):
            raise RuntimeError(f"the process groups are TP={ps.get_tensor_model_parallel_world_size()}/"
                               f"PP={ps.get_pipeline_model_parallel_world_size()}, not the requested "
                               f"TP={tensor_parallel}/PP={pipeline_parallel}")
        _check_output(output, overwrite)  # on every rank, so none waits at a barrier for a failed one
        dist.barrier()
        if dist.get_rank() == 0:
            if output.exists() and overwrite:
                shutil.rmtree(output)
            output.mkdir(parents=True, exist_ok=True)
        dist.barrier()
        engine = Engine(train_config.model, train_config.parallel, train_config.optimizer, train_iters=1)
        module = engine.model.module
        local_names = [k for k, v in module.state_dict().items() if torch.is_tensor(v) and "_extra_state" not in k]
        full = llama_state_to_megatron(read_hf_weights(hf_dir), train_config.model,
                                       train_config.model.padded_vocab_size(tensor_parallel))
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
                 "imported_from": str(hf_dir.resolve())}
        if tokenizer_json.is_file():
            state["tokenizer_path"] = str((output / "tokenizer" / "tokenizer.json").resolve())
            if dist.get_rank() == 0:
                shutil.copytree(hf_dir, output / "tokenizer", ignore=lambda d, names: [
                    n for n in names if n.startswith("model") or n.endswith((".safetensors", ".bin"))])
        ckpt.save(output, 0, engine, state, keep_last=1)
        if dist.get_rank() == 0:
            (output / "config.yaml").write_text(config_module.dump(train_config))
    finally:
        if owns_world:
            distributed.destroy()
    return output


def dataclasses_asdict(config) -> dict:
    """dataclasses.asdict with tuples as lists (YAML/JSON-safe)."""
    import dataclasses

    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(config).items()}


# ----------------------------------------------------------------------------- CLI


def export_cli(argv: list[str]) -> int:
    """`python -m pretrain export-hf`: checkpoint (any TP/PP) -> Hugging Face Llama directory."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m pretrain export-hf", description=export_cli.__doc__)
    parser.add_argument("--checkpoint", required=True, help="run directory (its latest) or an iter_* directory")
    parser.add_argument("--output", required=True, help="directory to write (must be empty unless --overwrite)")
    parser.add_argument("--tokenizer", help="tokenizer.json, SentencePiece .model, or vocab.json+merges.txt dir "
                        "(default: the one in the run's data manifest)")
    parser.add_argument("--no-tokenizer", action="store_true", help="export the model without tokenizer files")
    parser.add_argument("--rope-scaling", choices=HF_SCALING_KINDS, default="none",
                        help="ship an HF rope scaling (e.g. PosAug + YaRN); RFS models get their own linear scaling")
    parser.add_argument("--factor", type=float, help="scaling factor for --rope-scaling")
    parser.add_argument("--eval-length", type=int, help="RFS: evaluation length n_eval the linear factor "
                        "max(n_train, n_eval) / L is computed for (default n_train)")
    parser.add_argument("--max-shard-size", default="2GB", help="shard model.safetensors above this size")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty output directory")
    args = parser.parse_args(argv)
    try:
        path = export_checkpoint(args.checkpoint, args.output, tokenizer=args.tokenizer,
                                 no_tokenizer=args.no_tokenizer, rope_scaling=args.rope_scaling,
                                 factor=args.factor, eval_length=args.eval_length,
                                 max_shard_size=args.max_shard_size, dtype=args.dtype, overwrite=args.overwrite)
    except (ValueError, FileNotFoundError, FileExistsError, RuntimeError) as error:
        print(f"export-hf: error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {path} (load with transformers.AutoModelForCausalLM.from_pretrained({str(path)!r}))")
    return 0


def import_cli(argv: list[str]) -> int:
    """`python -m pretrain import-hf`: Llama-family HF directory -> our checkpoint (torchrun for TP×PP > 1)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m pretrain import-hf", description=import_cli.__doc__)
    parser.add_argument("--hf", required=True, help="Hugging Face model directory (config.json + safetensors)")
    parser.add_argument("--output", required=True, help="run directory to write the iteration-0 checkpoint to")
    parser.add_argument("--tensor-model-parallel-size", "--tp", type=int, default=1)
    parser.add_argument("--pipeline-model-parallel-size", "--pp", type=int, default=1)
    parser.add_argument("--seq-length", type=int, help="training window (default: max_position_embeddings)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="config override recorded with the checkpoint, e.g. positions.strategy=posaug")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
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
