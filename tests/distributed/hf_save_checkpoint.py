"""Train a tiny model for a few steps under a TP/PP layout and save our checkpoint (export-hf input).

Run under torchrun (`--tp 2 --pp 2` needs 4 processes), or call `train_and_save` in a process
whose Megatron world already has the requested layout. Prints 'RESULT {"path": ...}' per checkpoint.
"""

import argparse
import json

import torch
import torch.distributed as dist

from megatron_ext.model import ParallelConfig
from pretrain.table import model_preset
from megatron_ext.positions import PositionConfig, build_sampler
from pretrain.trainer import checkpoint, distributed
from pretrain.trainer.config import TrainConfig, to_dict
from pretrain.trainer.config_sections import CheckpointConfig, DataConfig, ScheduleConfig
from pretrain.trainer.config import OptimizerSettings
from pretrain.trainer.engine import Engine

MICRO_BATCH, MICROBATCHES, SEED = 2, 2, 1234


def tiny_config(run_dir: str, *, groups: int, untied: bool, tp: int = 1, pp: int = 1,
                positions: dict | None = None, vocab_size: int = 512) -> TrainConfig:
    """The tiny preset with the given attention/embedding variant and layout."""
    model = model_preset("tiny", num_query_groups=groups, untie_embeddings_and_output_weights=untied,
                   vocab_size=vocab_size)
    return TrainConfig(name="hf", seed=SEED, model=model,
                       parallel=ParallelConfig(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp),
                       positions=PositionConfig(**(positions or {"strategy": "posaug"})),
                       data=DataConfig(synthetic=True),
                       optimizer=OptimizerSettings(lr=3e-2, min_lr=3e-2, lr_decay_style="constant"),
                       schedule=ScheduleConfig(micro_batch_size=MICRO_BATCH,
                                               global_batch_size=MICRO_BATCH * MICROBATCHES, train_iters=2),
                       checkpoint=CheckpointConfig(save=run_dir))


def train_and_save(config: TrainConfig, steps: int = 2) -> str:
    """A few real training steps on synthetic tokens, then pretrain.trainer.checkpoint.save (collective)."""
    model = config.model
    sampler = build_sampler(config.positions, seed=config.seed, train_seq_len=model.seq_length,
                            num_layers=model.num_layers, rotary_dim=model.rotary_dim,
                            rotary_base=model.rotary_base, total_steps=steps)
    engine = Engine(model, config.parallel, config.optimizer, steps, per_sample_positions=sampler.needs_per_sample)
    _, dp_size = distributed.data_parallel_info()
    per_rank = MICROBATCHES // dp_size
    for step in range(steps):
        batches = []
        for index in range(per_rank):
            g = torch.Generator().manual_seed(100 * step + index)
            tokens = torch.randint(0, model.vocab_size, (MICRO_BATCH, model.seq_length + 1), generator=g)
            batches.append({"tokens": tokens[:, :-1], "labels": tokens[:, 1:],
                            "loss_mask": torch.ones(MICRO_BATCH, model.seq_length)})
        engine.train_step(iter(batches), sampler, step, per_rank, MICRO_BATCH, model.seq_length)
    path = checkpoint.save(config.checkpoint.save, steps, engine,
                           {"config": to_dict(config), "consumed_samples": steps * MICRO_BATCH * MICROBATCHES},
                           keep_last=1)
    return str(path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--pp", type=int, default=1)
    parser.add_argument("--variant", action="append", required=True,
                        help="RUN_DIR:GROUPS:tied|untied (repeatable; all saved in one launch)")
    args = parser.parse_args()
    distributed.initialize(ParallelConfig(tensor_model_parallel_size=args.tp,
                                          pipeline_model_parallel_size=args.pp), SEED)
    for variant in args.variant:
        run_dir, groups, tie = variant.rsplit(":", 2)
        config = tiny_config(run_dir, groups=int(groups), untied=tie == "untied", tp=args.tp, pp=args.pp)
        path = train_and_save(config)
        if dist.get_rank() == 0:
            print("RESULT " + json.dumps({"path": path}), flush=True)
    distributed.destroy()


if __name__ == "__main__":
    main()
