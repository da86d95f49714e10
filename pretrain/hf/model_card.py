"""README.md (model card) of an HF export: how it was trained, what RoPE it ships, how to call it."""

from __future__ import annotations

from megatron_ext.positions import RopeScaling
from megatron_ext.positions.scaling import HF_ROPE_TYPE

USAGE = '''## Loading

```python
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

model = AutoModelForCausalLM.from_pretrained(PATH, dtype=torch.float32)
tokenizer = AutoTokenizer.from_pretrained(PATH)  # when the export has tokenizer files
```

`config.json` carries RoPE in both transformers layouts: `rope_theta` + `rope_scaling`
(transformers 4.45-4.57) and `rope_parameters` (transformers 5.x).

## Calling the model at scaled or fractional positions

Position augmentation evaluates (and can be probed) at positions other than 0, 1, 2, ...:
PosAug's α·i, RFS's evaluation positions, position interpolation. HF Llama accepts float
`position_ids`, but **pass an explicit `attention_mask` with them**: without one,
transformers reads every gap between consecutive positions that is not exactly 1 as the
start of a new packed sequence and masks attention across it, silently giving wrong logits.

```python
positions = 0.5 * torch.arange(input_ids.shape[1], dtype=torch.float32)  # e.g. alpha = 0.5
out = model(input_ids=input_ids, position_ids=positions[None].expand(input_ids.shape[0], -1),
            attention_mask=torch.ones_like(input_ids), use_cache=False)
```

or, with this project installed, `pretrain.hf.scaled_positions_forward(model, input_ids, positions)`,
which does exactly that (positions `[s]` or `[b, s]`; an optional padding `attention_mask`).
'''


def _scaling_lines(train_config, scaling: RopeScaling | None, eval_length: int | None) -> list[str]:
    window = train_config.model.seq_length
    if train_config.positions.strategy == "rfs" and scaling is not None:
        from pretrain.hf.rope import rfs_eval_length

        n_eval = rfs_eval_length(train_config, eval_length)
        return [f"- Shipped RoPE scaling: linear, factor {scaling.factor:g} = max(n_train, n_eval) / L with "
                f"n_train = {window}, evaluation length n_eval = {n_eval}"
                f"{' (default: window × 8)' if eval_length is None else ''}, "
                f"L = positions.max_position = {train_config.positions.max_position}.",
                f"  It reproduces the run's RFS evaluation positions for sequences of {n_eval} tokens; "
                "for another evaluation length re-export with `--eval-length`."]
    if scaling is None:
        return ["- Shipped RoPE scaling: none (the run evaluates with plain RoPE at positions 0, 1, 2, ...)."]
    return [f"- Shipped RoPE scaling: {scaling.kind} (HF rope_type {HF_ROPE_TYPE[scaling.kind]!r}), "
            f"factor {scaling.factor:g}, original window {window} (chosen at export, not part of training)."]


def model_card(train_config, record: dict, scaling: RopeScaling | None, eval_length: int | None,
               served: int | None = None) -> str:
    """The export's README.md text."""
    model, positions = train_config.model, train_config.positions
    architecture = "A Qwen2-architecture (`Qwen2ForCausalLM`)" if model.add_qkv_bias else \
        "A Llama-architecture (`LlamaForCausalLM`)"
    needs = []
    from pretrain.hf.qwen3 import card_architecture, uses_qwen

    if uses_qwen(model):
        architecture, needs = card_architecture(model)
    elif model.no_rope_freq is not None:
        architecture = "A Llama 4 text (`Llama4ForCausalLM`: dense, no qk-norm, no chunked attention)"
        from megatron_ext.positions import nope_layers

        nope = sum(map(bool, nope_layers(model.num_layers, model.no_rope_freq)))
        temperature = ", with attention temperature on them" if model.attn_temperature_tuning else ""
        needs = [f"- NoPE-interleaved: {nope} of {model.num_layers} layers without RoPE (model.no_rope_freq = "
                 f"{model.no_rope_freq}){temperature}; loads with transformers >= 4.57."]
    elif model.rope_proportion < 1.0:
        from pretrain.hf.support import PROPORTIONAL_ROPE_SINCE

        needs = [f"- p-RoPE (proportion {model.rope_proportion:g}) as rope_type `proportional`; loads with "
                 f"transformers >= {PROPORTIONAL_ROPE_SINCE}."]
    llama3 = model.rope_scaling()
    own = [] if llama3 is None else [
        f"- The model's own RoPE scaling (part of training): llama3, factor {llama3.factor:g}, original window "
        f"{llama3.original_max_position_embeddings}, low/high frequency factors {llama3.low_freq_factor:g}/"
        f"{llama3.high_freq_factor:g}."]
    lines = [f"# {train_config.name}", "",
             f"{architecture} export of a Megatron-Core checkpoint trained with "
             "training-time RoPE position augmentation.", "",
             f"- Position strategy: `{positions.strategy}`; training window {model.seq_length} tokens; "
             f"RoPE base {model.rotary_base:g}.",
             f"- Iteration {record.get('iteration')}, {record.get('consumed_samples')} samples consumed.",
             f"- {model.num_layers} layers, hidden {model.hidden_size}, {model.num_attention_heads} heads "
             f"({model.num_query_groups} key/value groups), vocabulary {model.vocab_size}.",
             *(own or _scaling_lines(train_config, scaling, eval_length)),
             *needs,
             *([] if served is None else [
                 f"- config.json's max_position_embeddings = {served}: the context this model is meant to serve "
                 "(the rule per method: pretrain/hf/context.py); its training window is "
                 "`posaug_training.train_seq_length`."]),
             "- The full positions section is in config.json under `posaug_training`.", "", USAGE]
    return "\n".join(lines)
