"""Real training steps under torchrun for each cluster knob; prints one JSON record per (variant, step).

Used by tests/trainer/test_knobs.py. Each variant runs in the same launch (one process-group setup
per layout): the same microbatches, weights and PosAug positions, with and without the knob, so the
test compares loss, gradient norm and final parameters against the plain run.

  --layout dp2: DP=2, variants plain / overlap_grad_reduce / distributed optimizer with and without
                overlap_grad_reduce + overlap_param_gather.
  --layout vp:  1 rank: the reference; 2 ranks: PP=2 × VP=2 (interleaved 1F1B) from the same weights.
"""

import argparse
import json
import os

import torch
import torch.distributed as dist

from megatron_ext.model import ParallelConfig
from megatron_ext.positions import PositionConfig, build_sampler
from pretrain.table import model_preset
from pretrain.trainer import distributed
from pretrain.trainer.config import OptimizerSettings
from pretrain.trainer.engine import Engine

GLOBAL_MICROBATCHES, MICRO_BATCH, SEED, STEPS = 4, 2, 1234, 3
DP_VARIANTS = {
    "plain": {},
    "overlap_grad_reduce": {"overlap_grad_reduce": True},
    "distributed_optimizer": {"use_distributed_optimizer": True},
    "overlap_param_gather": {"use_distributed_optimizer": True, "overlap_grad_reduce": True,
                             "overlap_param_gather": True},
}


def microbatches(model, count, offset):
    """Deterministic token microbatches, independent of the layout."""
    out = []
    for index in range(offset, offset + count):
        g = torch.Generator().manual_seed(1000 + index)
        tokens = torch.randint(0, model.vocab_size, (MICRO_BATCH, model.seq_length + 1), generator=g)
        out.append({"tokens": tokens[:, :-1], "labels": tokens[:, 1:],
                    "loss_mask": torch.ones(MICRO_BATCH, model.seq_length)})
    return out


def one_process_weights(model):
    """{global name: tensor} of the weights one process draws for this seed (PP changes the init order)."""
    from megatron_ext.model import build_model

    distributed.initialize(ParallelConfig(), SEED)
    module = build_model(model)
    return {name: tensor.clone() for name, tensor in module.state_dict().items() if torch.is_tensor(tensor)}


def load_global_weights(engine, weights):
    """Copy one-process weights into every chunk, mapping local layer indices to global ones."""
    for chunk in engine.chunks:
        module = chunk.module
        local = {}
        for name, tensor in module.state_dict().items():
            if not torch.is_tensor(tensor):
                continue
            global_name = name
            if name.startswith("decoder.layers."):
                parts = name.split(".")
                parts[2] = str(module.decoder.layers[int(parts[2])].layer_number - 1)
                global_name = ".".join(parts)
            if global_name == "output_layer.weight" and global_name not in weights:
                global_name = "embedding.word_embeddings.weight"  # tied: the last stage's copy
            if global_name in weights:
                local[name] = weights[global_name]
        module.load_state_dict(local, strict=False)


def run(model, parallel, name, weights=None):
    """STEPS optimizer steps of `parallel`; prints loss, grad norm and a parameter checksum per step."""
    distributed.initialize(parallel, SEED)
    # Per-layer PosAug: every layer (and every pipeline chunk) must see its own row of angles.
    sampler = build_sampler(PositionConfig(strategy="posaug", layer_mode="independent"), seed=SEED,
                            train_seq_len=model.seq_length, num_layers=model.num_layers,
                            rotary_dim=model.rotary_dim, rotary_base=model.rotary_base, total_steps=STEPS)
    engine = Engine(model, parallel, OptimizerSettings(lr=1e-3, min_lr=1e-3, lr_decay_style="constant",
                                                       clip_grad=0.0), train_iters=STEPS)
    if weights is not None:
        load_global_weights(engine, weights)
    dp_rank, dp_size = distributed.data_parallel_info()
    per_rank = GLOBAL_MICROBATCHES // dp_size
    for step in range(STEPS):
        data = microbatches(model, per_rank, offset=step * GLOBAL_MICROBATCHES + dp_rank * per_rank)
        result = engine.train_step(iter(data), sampler, step, per_rank, MICRO_BATCH, model.seq_length)
        engine.sync_params()
        parameters = global_parameters(engine)
        if dist.get_rank() == 0:
            print("RESULT " + json.dumps({"variant": name, "step": step, "loss": result.loss,
                                          "grad_norm": result.grad_norm, "parameters": parameters}), flush=True)
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()


def global_parameters(engine):
    """{global parameter name: sum of squares} over every chunk and pipeline rank (tied copies once)."""
    from megatron.core.transformer.transformer_layer import TransformerLayer

    local = {}
    for chunk in engine.chunks:
        for module_name, module in chunk.module.named_modules():
            if isinstance(module, TransformerLayer):
                for name, p in module.named_parameters():
                    local[f"layer{module.layer_number}.{name}"] = float(p.detach().double().pow(2).sum())
        for name, p in chunk.module.named_parameters():
            if not name.startswith("decoder.layers.") and name != "output_layer.weight":
                local[name] = float(p.detach().double().pow(2).sum())
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, local)
    return {k: v for part in gathered for k, v in part.items()}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--layout", choices=("dp2", "vp"), required=True)
    args = parser.parse_args()
    model = model_preset("tiny")
    if args.layout == "dp2":
        for name, knobs in DP_VARIANTS.items():
            run(model, ParallelConfig(**knobs), name)
    elif int(os.environ["WORLD_SIZE"]) == 1:
        run(model, ParallelConfig(), "one_process")
    else:
        run(model, ParallelConfig(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2),
            "pp2_vp2", weights=one_process_weights(model))
    distributed.destroy()


if __name__ == "__main__":
    main()
