"""Real training steps under torchrun for every position method in one launch; saves losses and weights.

Used by tests/trainer/test_parallel_equivalence.py: the same global batch, initial weights and seed under
TP=2, PP=2 (1F1B), DP=2 (with or without the distributed optimizer) or another micro-batch size must give
one process's losses and parameters, for every strategy, because position draws are keyed on the global
sample index and never on the layout. One launch loops over all strategies (a launch costs ~10 s of imports).
"""

import argparse
import json

import torch
import torch.distributed as dist

from megatron_ext.model import ParallelConfig, build_model
from megatron_ext.positions import PositionConfig, build_sampler
from pretrain.table import model_preset
from pretrain.trainer import distributed
from pretrain.trainer.config import OptimizerSettings
from pretrain.trainer.engine import Engine

GLOBAL_BATCH, SEED = 4, 1234

STRATEGIES = {
    "none": {},
    "posaug_uniform": {"strategy": "posaug"},
    "posaug_log_uniform": {"strategy": "posaug", "alpha_distribution": "log_uniform"},
    "posaug_discrete": {"strategy": "posaug", "alpha_distribution": "discrete"},
    "posaug_cycle": {"strategy": "posaug", "alpha_distribution": "cycle"},
    "posaug_fixed": {"strategy": "posaug", "alpha_distribution": "fixed", "alpha_fixed": 0.37},
    "posaug_bottom": {"strategy": "posaug", "layer_mode": "bottom", "layer_count": 2},
    "posaug_top": {"strategy": "posaug", "layer_mode": "top", "layer_count": 2},
    "posaug_independent": {"strategy": "posaug", "layer_mode": "independent"},
    "posaug_per_sample": {"strategy": "posaug", "granularity": "per_sample"},
    "random_base": {"strategy": "random_base"},
    "rfs_per_step": {"strategy": "rfs", "granularity": "per_step"},
    "rfs_per_sample": {"strategy": "rfs", "granularity": "per_sample"},
    "rpe": {"strategy": "rpe", "max_position": 256},
    "warp": {"strategy": "warp", "p_head": 0.4, "p_tail": 0.4},
    "pose": {"strategy": "pose", "max_position": 256},
    "ryarn": {"strategy": "ryarn", "max_position": 256, "ryarn_stages": [0.5, 1.0]},  # 3 steps: both stages
    # DroPE: 3 steps, the last without RoPE (1 of 3 recalibrates), plain RoPE or PosAug before it
    "drope": {"strategy": "drope", "drope_share": 0.34},
    "posaug_drope": {"strategy": "drope", "drope_pretraining": "posaug", "drope_share": 0.34},
    "prope": {},
    "irope": {},
    "ssmax": {},
    "posaug_prope": {"strategy": "posaug"},
    "posaug_irope": {"strategy": "posaug"},
    "qknorm": {},
    "swa_posaug_global": {"strategy": "posaug", "layer_mode": "global"},
    "sinks": {},
}
# The rows whose method is a model option (pretrain/table.py's p-RoPE, NoPE-interleave + temperature, SSMax),
# with values far enough from 1 that a layout-dependent factor would show.
_IROPE = {"no_rope_freq": 2, "attn_temperature_tuning": True, "attn_temperature_beta": 0.5,
          "attn_temperature_floor": 4}
MODEL_OPTIONS = {"prope": {"rope_proportion": 0.5}, "irope": _IROPE, "ssmax": {"ssmax_scale": 0.3},
                 "posaug_prope": {"rope_proportion": 0.5}, "posaug_irope": _IROPE,
                 # long-context recipes (megatron_ext.local_attention): a window well inside the 32-token sequence
                 "qknorm": {"qk_layernorm": True}, "sinks": {"softmax_type": "learnable"},
                 "swa_posaug_global": {"window_size": 8, "window_attn_skip_freq": 2, "rotary_base_local": 500.0}}


def sample(model, index: int) -> torch.Tensor:
    """Global sample `index` of the synthetic corpus: seq_length + 1 tokens, independent of the layout."""
    g = torch.Generator().manual_seed(1000 + index)
    return torch.randint(0, model.vocab_size, (model.seq_length + 1,), generator=g)


def with_documents(model, tokens: torch.Tensor) -> torch.Tensor:
    """`tokens` with about four EOD-ended documents per window (data.document_masking), a fixed function of them."""
    g = torch.Generator().manual_seed(int(tokens.sum()))
    return torch.where(torch.rand(tokens.shape, generator=g) < 4 / model.seq_length, model.vocab_size - 1, tokens)


def rank_microbatches(model, step: int, dp_rank: int, per_rank: int, micro_batch_size: int,
                      document_masking: bool = False) -> list[dict]:
    """This DP rank's microbatches of `step`, in pretrain.trainer.data.step_batches' order."""
    first = step * GLOBAL_BATCH + dp_rank * per_rank
    out = []
    for start in range(first, first + per_rank, micro_batch_size):
        tokens = torch.stack([sample(model, i) for i in range(start, start + micro_batch_size)])
        batch = {"tokens": tokens[:, :-1], "labels": tokens[:, 1:],
                 "loss_mask": torch.ones(micro_batch_size, model.seq_length)}
        if document_masking:
            from megatron_ext.positions.documents import document_index

            tokens = torch.stack([with_documents(model, t) for t in tokens])
            batch = {"tokens": tokens[:, :-1], "labels": tokens[:, 1:], "loss_mask": batch["loss_mask"],
                     "document_index": document_index(tokens[:, :-1], model.vocab_size - 1)}
        out.append(batch)
    return out


def global_name(name: str, first_layer: int) -> str:
    """This stage's parameter name as the PP=1 model calls it."""
    if name.startswith("decoder.layers."):
        parts = name.split(".")
        parts[2] = str(int(parts[2]) + first_layer)
        return ".".join(parts)
    return name


def full_model_state(model) -> dict:
    """Weights of the PP=1 model for this seed, to load stage by stage (PP changes init order)."""
    from megatron.core import parallel_state

    distributed.initialize(ParallelConfig(), SEED)
    state = {k: v.clone() for k, v in build_model(model).state_dict().items() if torch.is_tensor(v)}
    parallel_state.destroy_model_parallel()
    return state


def load_stage(engine: Engine, reference: dict, first_layer: int) -> None:
    module = engine.model.module
    local = {}
    for name, value in module.state_dict().items():
        if not torch.is_tensor(value):
            continue
        name_in_full = global_name(name, first_layer)
        if name_in_full == "output_layer.weight" and name_in_full not in reference:
            name_in_full = "embedding.word_embeddings.weight"  # tied: last stage's copy
        if name_in_full in reference:
            local[name] = reference[name_in_full]
    # DDP keeps grads in its own buffers; params are loaded in place. bf16 and the distributed optimizer step
    # fp32 main copies taken at build time: refresh them from the loaded params.
    module.load_state_dict(local, strict=False)
    engine.optimizer.reload_model_params()


def full_parameters(engine: Engine, model, first_layer: int) -> dict | None:
    """Every parameter as the one-process model holds it, on global rank 0 (None elsewhere)."""
    from megatron.core import parallel_state

    tp_group = parallel_state.get_tensor_model_parallel_group()
    tp = parallel_state.get_tensor_model_parallel_world_size()
    mine = {}
    for name, param in engine.model.module.named_parameters():
        if name == "output_layer.weight" and not model.untie_embeddings_and_output_weights:
            continue  # the last stage's copy of the tied embedding
        value = param.detach().float()
        if tp > 1 and getattr(param, "tensor_model_parallel", False):
            shards = [torch.empty_like(value) for _ in range(tp)]
            dist.all_gather(shards, value.contiguous(), group=tp_group)
            if name.endswith("mlp.linear_fc1.weight"):
                # SwiGLU (megatron_ext.model): each TP shard of fc1 is [gate_r; up_r], the full one [gate; up].
                halves = [shard.chunk(2, dim=0) for shard in shards]
                shards = [h[0] for h in halves] + [h[1] for h in halves]
            value = torch.cat(shards, dim=param.partition_dim)
        mine[global_name(name, first_layer)] = value
    keep = parallel_state.get_tensor_model_parallel_rank() == 0 and parallel_state.get_data_parallel_rank() == 0
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine if keep else {})
    if dist.get_rank() != 0:
        return None
    return {k: v for part in gathered for k, v in part.items()}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--pp", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--micro-batch-size", type=int, default=1)
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--distributed-optimizer", action="store_true")
    parser.add_argument("--document-masking", action="store_true", help="EOD-ended documents, masked apart")
    parser.add_argument("--document-strategies", default="",
                        help="rows also run with document masking in the same launch, saved as '<name>+documents'")
    parser.add_argument("--bf16", action="store_true", help="bf16 params, fp32 main params and grads")
    parser.add_argument("--bf16-strategies", default="",
                        help="rows also run in bf16 in the same launch, saved as '<name>+bf16'")
    parser.add_argument("--out", required=True, help="torch.save file: {strategy: {losses, parameters}}")
    args = parser.parse_args()
    model = model_preset("tiny", bf16=args.bf16)
    parallel = ParallelConfig(tensor_model_parallel_size=args.tp, pipeline_model_parallel_size=args.pp,
                              sequence_parallel=args.tp > 1,
                              use_distributed_optimizer=args.distributed_optimizer)
    # (row name, strategy, document masking): a launch costs ~10 s of imports per rank, so the document-masked
    # rows share the launch of the plain ones.
    rows = [(name, name, args.document_masking, args.bf16) for name in args.strategies.split(",")]
    rows += [(f"{name}+documents", name, True, args.bf16)
             for name in filter(None, args.document_strategies.split(","))]
    rows += [(f"{name}+bf16", name, args.document_masking, True)
             for name in filter(None, args.bf16_strategies.split(","))]
    # QK-norm and learnable sinks add parameters: each row's PP reference weights come from its own model, built
    # once per distinct model (its options and precision), not once per row.
    built: dict[tuple, dict] = {}

    def reference(name: str, bf16: bool) -> dict:
        options = MODEL_OPTIONS.get(name, {})
        key = (bf16, tuple(sorted(options.items())))
        if key not in built:
            built[key] = full_model_state(model_preset("tiny", bf16=bf16, **options))
        return built[key]

    references = {(name, bf16): reference(name, bf16) for _, name, _, bf16 in rows} if args.pp > 1 else {}
    distributed.initialize(parallel, SEED)
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    first_layer = parallel_state.get_pipeline_model_parallel_rank() * (model.num_layers // args.pp)
    dp_rank, dp_size = distributed.data_parallel_info()
    per_rank = GLOBAL_BATCH // dp_size
    results = {}
    for row, name, document_masking, bf16 in rows:
        model = model_preset("tiny", bf16=bf16, **MODEL_OPTIONS.get(name, {}))
        sampler = build_sampler(PositionConfig(**STRATEGIES[name]), seed=SEED, train_seq_len=model.seq_length,
                                num_layers=model.num_layers, rotary_dim=model.rotary_dim,
                                rotary_base=model.rotary_base, total_steps=args.steps,
                                global_layers=model.global_rope_layers())
        # Every strategy starts from the same weights, as a fresh process would.
        distributed.seed_all(SEED)
        model_parallel_cuda_manual_seed(SEED)
        # adam_eps well above the gradients' rounding noise: with the default 1e-8 Adam's first update,
        # lr * g / |g|, turns reduction-order noise on near-zero gradients into 1e-5 weight changes.
        optimizer = OptimizerSettings(lr=1e-3, min_lr=1e-3, lr_decay_style="constant", clip_grad=0.0, adam_eps=1e-4)
        engine = Engine(model, parallel, optimizer,
                        train_iters=args.steps,
                        per_sample_positions=sampler.needs_per_sample or document_masking,
                        recalibration_start=sampler.switch_step)
        if (name, bf16) in references:
            load_stage(engine, references[(name, bf16)], first_layer)
        losses = []
        for step in range(args.steps):
            data = rank_microbatches(model, step, dp_rank, per_rank, args.micro_batch_size, document_masking)
            result = engine.train_step(iter(data), sampler, step, len(data), args.micro_batch_size,
                                       model.seq_length)
            losses.append(result.loss)
        parameters = full_parameters(engine, model, first_layer)
        if dist.get_rank() == 0:
            results[row] = {"losses": losses, "parameters": parameters}
            print("RESULT " + json.dumps({"strategy": row, "losses": losses}), flush=True)
        del engine
    if dist.get_rank() == 0:
        torch.save(results, args.out)
    distributed.destroy()


if __name__ == "__main__":
    main()
