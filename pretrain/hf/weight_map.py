"""Megatron GPT ↔ Hugging Face Llama / Mistral / Qwen2 weight names: one table, read in both directions.

Layout of the TP=1/PP=1 state dict of `FloatPositionGPTModel` (local or TE spec):

- `self_attention.linear_qkv.weight` is grouped per query group: rows
  `[q_0 .. q_{h/g-1}, k, v]` for group 0, then group 1, ...; it becomes q/k/v_proj.
  Its bias (model.add_qkv_bias: Qwen2) has the same grouped layout and becomes q/k/v_proj.bias.
- `mlp.linear_fc1.weight` is `[gate; up]` (SwiGLU); it becomes gate_proj / up_proj.
- Megatron's default (non-interleaved) RoPE rotates halves exactly like HF's
  `rotate_half`, so q/k rows need no permutation (interleaved RoPE is refused on export).
- The embedding (and untied output layer) carry vocabulary padding: trimmed on export,
  zero-padded on import.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import torch

from megatron_ext.model import ModelConfig

Tensor = torch.Tensor


def split_qkv(qkv: Tensor, model_config: ModelConfig) -> tuple[Tensor, Tensor, Tensor]:
    """Megatron grouped QKV rows [g × (q..., k, v)] -> (q_proj, k_proj, v_proj) weights (or biases, 1-D)."""
    heads, groups, d = model_config.num_attention_heads, model_config.num_query_groups, model_config.kv_channels
    per_group, trailing = heads // groups, tuple(qkv.shape[1:])
    grouped = qkv.reshape(groups, per_group + 2, d, *trailing)
    q = grouped[:, :per_group].reshape(heads * d, *trailing)
    k = grouped[:, per_group].reshape(groups * d, *trailing)
    v = grouped[:, per_group + 1].reshape(groups * d, *trailing)
    return q, k, v


def merge_qkv(q: Tensor, k: Tensor, v: Tensor, model_config: ModelConfig) -> Tensor:
    """Inverse of `split_qkv`."""
    heads, groups, d = model_config.num_attention_heads, model_config.num_query_groups, model_config.kv_channels
    per_group, trailing = heads // groups, tuple(q.shape[1:])
    grouped = torch.cat([q.reshape(groups, per_group, d, *trailing), k.reshape(groups, 1, d, *trailing),
                         v.reshape(groups, 1, d, *trailing)], dim=1)
    return grouped.reshape(-1, *trailing)


def split_gate_up(fc1: Tensor, model_config: ModelConfig) -> tuple[Tensor, Tensor]:
    """Megatron SwiGLU fc1 rows [gate; up] -> (gate_proj, up_proj) weights."""
    f = model_config.ffn_hidden_size
    if fc1.shape[0] != 2 * f:
        raise ValueError(f"cannot export: mlp.linear_fc1 has {fc1.shape[0]} rows, expected "
                         f"2 × ffn_hidden_size = {2 * f} (the model must be SwiGLU)")
    return fc1[:f], fc1[f:]


def merge_gate_up(gate: Tensor, up: Tensor, model_config: ModelConfig) -> Tensor:
    """Inverse of `split_gate_up`."""
    return torch.cat([gate, up])


@dataclass(frozen=True)
class Rule:
    """One Megatron tensor and the HF tensor(s) it is; `{}` stands for the layer index."""

    megatron: str
    hf: tuple[str, ...]
    split: Callable[..., tuple[Tensor, ...]] | None = None  # (megatron, config) -> hf tensors
    merge: Callable[..., Tensor] | None = None  # (*hf tensors, config) -> megatron
    aliases: tuple[str, ...] = ()  # other Megatron spellings (the TE spec fuses norms into linears)
    vocab_rows: bool = False  # rows are the (padded) vocabulary
    when: Callable[[ModelConfig], bool] | None = None  # present only for models where this holds
    tp: str | None = None  # tensor-parallel sharding: "rows", "cols", "gate_up" (each half by rows), None


L = "decoder.layers.{}."
H = "model.layers.{}."
WEIGHT_MAP: tuple[Rule, ...] = (
    Rule("embedding.word_embeddings.weight", ("model.embed_tokens.weight",), vocab_rows=True, tp="rows"),
    Rule(L + "input_layernorm.weight", (H + "input_layernorm.weight",),
         aliases=(L + "self_attention.linear_qkv.layer_norm_weight",)),
    Rule(L + "self_attention.linear_qkv.weight",
         (H + "self_attn.q_proj.weight", H + "self_attn.k_proj.weight", H + "self_attn.v_proj.weight"),
         split=split_qkv, merge=merge_qkv, tp="rows"),  # whole query groups per shard
    Rule(L + "self_attention.linear_qkv.bias",
         (H + "self_attn.q_proj.bias", H + "self_attn.k_proj.bias", H + "self_attn.v_proj.bias"),
         split=split_qkv, merge=merge_qkv, tp="rows", when=lambda m: m.add_qkv_bias),
    Rule(L + "self_attention.linear_proj.weight", (H + "self_attn.o_proj.weight",), tp="cols"),
    Rule(L + "pre_mlp_layernorm.weight", (H + "post_attention_layernorm.weight",),
         aliases=(L + "mlp.linear_fc1.layer_norm_weight",)),
    Rule(L + "mlp.linear_fc1.weight", (H + "mlp.gate_proj.weight", H + "mlp.up_proj.weight"),
         split=split_gate_up, merge=merge_gate_up, tp="gate_up"),
    Rule(L + "mlp.linear_fc2.weight", (H + "mlp.down_proj.weight",), tp="cols"),
    Rule("decoder.final_layernorm.weight", ("model.norm.weight",)),
    Rule("output_layer.weight", ("lm_head.weight",), vocab_rows=True, tp="rows",
         when=lambda m: m.untie_embeddings_and_output_weights),
)


def _instances(rule: Rule, model_config: ModelConfig) -> list[tuple[str, ...]]:
    """(megatron name, *aliases, *hf names) per layer (one entry for non-layer tensors)."""
    names = (rule.megatron, *rule.aliases, *rule.hf)
    if "{}" not in rule.megatron:
        return [names]
    return [tuple(n.format(i) for n in names) for i in range(model_config.num_layers)]


def _applies(rule: Rule, model_config: ModelConfig) -> bool:
    return rule.when is None or rule.when(model_config)


def megatron_to_hf_names(state: dict[str, Tensor], model_config: ModelConfig, vocab_size: int) -> dict[str, Tensor]:
    """HF tensors from a TP=1/PP=1 Megatron state dict (vocabulary trimmed to vocab_size)."""
    out: dict[str, Tensor] = {}
    for rule in WEIGHT_MAP:
        if not _applies(rule, model_config):
            continue
        for names in _instances(rule, model_config):
            sources, targets = names[: 1 + len(rule.aliases)], names[1 + len(rule.aliases):]
            found = [n for n in sources if n in state]
            if not found:
                raise ValueError(f"cannot export: the checkpoint has none of {', '.join(sources)}")
            tensor = state[found[0]]
            if rule.vocab_rows:
                if vocab_size > tensor.shape[0]:
                    raise ValueError(f"vocab_size {vocab_size} exceeds the checkpoint's {found[0]} rows "
                                     f"{tensor.shape[0]}")
                tensor = tensor[:vocab_size]
            pieces = rule.split(tensor, model_config) if rule.split else (tensor,)
            out.update(zip(targets, pieces))
    return out


def hf_to_megatron_names(hf_state: dict[str, Tensor], model_config: ModelConfig,
                         padded_vocab_size: int) -> dict[str, Tensor]:
    """TP=1/PP=1 Megatron state dict (local-spec names) from HF tensors (vocabulary zero-padded)."""
    out: dict[str, Tensor] = {}
    used: set[str] = set()
    for rule in WEIGHT_MAP:
        if not _applies(rule, model_config):
            continue
        for names in _instances(rule, model_config):
            target, sources = names[0], names[1 + len(rule.aliases):]
            missing = [n for n in sources if n not in hf_state]
            if missing:
                raise ValueError(f"cannot import: the HF weights lack {', '.join(missing)}")
            used.update(sources)
            pieces = [hf_state[n] for n in sources]
            tensor = rule.merge(*pieces, model_config) if rule.merge else pieces[0]
            if rule.vocab_rows:
                padded = tensor.new_zeros(padded_vocab_size, tensor.shape[1])
                padded[: tensor.shape[0]] = tensor
                tensor = padded
            out[target] = tensor
    # A tied model may still store lm_head.weight (the embedding); rotary inv_freq buffers are derived.
    ignorable = ("lm_head.weight",) if not model_config.untie_embeddings_and_output_weights else ()
    unused = sorted(n for n in hf_state if n not in used and n not in ignorable and not n.endswith(".inv_freq"))
    if unused:
        raise ValueError(f"cannot import: {len(unused)} HF tensor(s) have no place in the model, e.g. {unused[0]} "
                         "(a feature config.json does not declare)")
    return out


def _pattern(name: str) -> re.Pattern:
    return re.compile(re.escape(name).replace(re.escape("{}"), r"(\d+)") + "$")


_LOOKUP = [(rule, _pattern(name), name == rule.megatron)
           for rule in WEIGHT_MAP for name in (rule.megatron, *rule.aliases)]


def shard_for_rank(full: dict[str, Tensor], local_names: list[str], model_config: ModelConfig,
                   *, tp_rank: int, tp_size: int, first_layer: int) -> dict[str, Tensor]:
    """This rank's slices of a TP=1/PP=1 state dict (from `hf_to_megatron_names`), keyed by its local names."""
    out = {}
    for name in local_names:
        matched = next(((rule, m) for rule, pattern, _ in _LOOKUP if (m := pattern.match(name))), None)
        if matched is None:
            raise ValueError(f"cannot import: the model has a tensor {name} that no HF weight maps to")
        rule, match = matched
        if match.groups():
            global_name = rule.megatron.format(int(match.group(1)) + first_layer)
        else:
            global_name = rule.megatron
        if global_name == "output_layer.weight" and global_name not in full:
            global_name = "embedding.word_embeddings.weight"  # tied: the last stage's copy
        weight = full[global_name]
        if rule.tp == "gate_up":
            # Each TP shard holds [gate_r; up_r], not a contiguous slice of [gate; up].
            gate, up = split_gate_up(weight, model_config)
            weight = torch.cat([gate.chunk(tp_size)[tp_rank], up.chunk(tp_size)[tp_rank]])
        elif rule.tp == "rows":
            weight = weight.chunk(tp_size, dim=0)[tp_rank]
        elif rule.tp == "cols":
            weight = weight.chunk(tp_size, dim=1)[tp_rank]
        out[name] = weight
    return out
