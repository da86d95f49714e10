"""`import-hf` at TP=2 under torchrun, the imported model's logits at TP=2, then PosAug steps at TP=2.

`python -m torch.distributed.run --nproc_per_node=2 tests/distributed/hf_import_logits.py --tokens t.pt
--positions p.pt --out logits.pt HF_DIR:RUN_DIR ...` imports every HF_DIR into RUN_DIR with TP=2, rebuilds the
model at TP=2 from the checkpoint, runs it on the tokens at every row of positions, and rank 0 saves
{HF_DIR: logits [rows, b, s, V]}. With --train-steps N it then trains N PosAug steps at TP=2 from the
import and saves them to RUN_DIR-tuned (sharded). Prints 'RESULT {...}' per import.
"""

import argparse
import json

import torch
import torch.distributed as dist

from megatron_ext.model import ParallelConfig, build_model
from megatron_ext.positions import PositionConfig, build_sampler
from pretrain.hf.importer import import_hf
from pretrain.trainer import checkpoint, distributed
from pretrain.trainer.config import OptimizerSettings, from_dict, to_dict
from pretrain.trainer.engine import Engine

MICRO_BATCH, MICROBATCHES = 1, 2


def gathered_logits(model, tokens, positions, vocab_size):
    """Full-vocabulary logits of a TP-sharded model (output layer shards concatenated)."""
    with torch.no_grad():
        local = model(tokens, positions, None)
    shards = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(shards, local.contiguous())
    return torch.cat(shards, dim=-1)[..., :vocab_size]


def fine_tune(run_dir: str, steps: int) -> str:
    """`steps` PosAug steps at this world's TP from the checkpoint in run_dir, saved to run_dir-tuned."""
    config = from_dict(checkpoint.read_train_state(run_dir)["config"])
    config.positions = PositionConfig(strategy="posaug")
    config.optimizer = OptimizerSettings(lr=1e-2, min_lr=1e-2, lr_decay_style="constant")
    model = config.model
    sampler = build_sampler(config.positions, seed=0, train_seq_len=model.seq_length, num_layers=model.num_layers,
                            rotary_dim=model.rotary_dim, rotary_base=model.rotary_base, total_steps=steps)
    engine = Engine(model, config.parallel, config.optimizer, steps)
    checkpoint.load(run_dir, engine, load_optimizer=False)
    for step in range(steps):
        g = torch.Generator().manual_seed(step)
        tokens = torch.randint(0, model.vocab_size, (MICROBATCHES, MICRO_BATCH, model.seq_length + 1), generator=g)
        batches = [{"tokens": t[:, :-1], "labels": t[:, 1:], "loss_mask": torch.ones(MICRO_BATCH, model.seq_length)}
                   for t in tokens]
        engine.train_step(iter(batches), sampler, step, MICROBATCHES, MICRO_BATCH, model.seq_length)
    return str(checkpoint.save(run_dir + "-tuned", steps, engine,
                               {"config": to_dict(config), "consumed_samples": steps * MICRO_BATCH * MICROBATCHES},
                               keep_last=1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", required=True)
    parser.add_argument("--positions", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--train-steps", type=int, default=0)
    parser.add_argument("pairs", nargs="+", help="HF_DIR:RUN_DIR")
    args = parser.parse_args()
    tokens, positions = torch.load(args.tokens), torch.load(args.positions)
    parallel = ParallelConfig(tensor_model_parallel_size=2)
    distributed.initialize(parallel, seed=0)
    out = {}
    for pair in args.pairs:
        hf_dir, run_dir = pair.rsplit(":", 1)
        import_hf(hf_dir, run_dir, tensor_parallel=2)
        config = from_dict(checkpoint.read_train_state(run_dir)["config"])
        model = build_model(config.model, parallel).eval()
        checkpoint.load_model_weights(run_dir, model)
        out[hf_dir] = torch.stack([gathered_logits(model, tokens, row, config.model.vocab_size) for row in positions])
        tuned = fine_tune(run_dir, args.train_steps) if args.train_steps else None
        if dist.get_rank() == 0:
            print("RESULT " + json.dumps({"hf": hf_dir, "tp": config.parallel.tensor_model_parallel_size,
                                          "tuned": tuned}), flush=True)
    if dist.get_rank() == 0:
        torch.save(out, args.out)
    distributed.destroy()


if __name__ == "__main__":
    main()
