"""`import-hf` at TP=2 under torchrun, then the imported model's logits at TP=2 (vocabulary shards gathered).

`python -m torch.distributed.run --nproc_per_node=2 tests/distributed/hf_import_logits.py --tokens t.pt
--positions p.pt --out logits.pt HF_DIR:RUN_DIR ...` imports every HF_DIR into RUN_DIR with TP=2, rebuilds the
model at TP=2 from the checkpoint, runs it on the tokens at every row of positions, and rank 0 saves
{HF_DIR: logits [rows, b, s, V]}. Prints 'RESULT {...}' per import.
"""

import argparse
import json

import torch
import torch.distributed as dist

from megatron_ext.model import ParallelConfig, build_model
from pretrain.hf.importer import import_hf
from pretrain.trainer import checkpoint, distributed
from pretrain.trainer.config import from_dict


def gathered_logits(model, tokens, positions, vocab_size):
    """Full-vocabulary logits of a TP-sharded model (output layer shards concatenated)."""
    with torch.no_grad():
        local = model(tokens, positions, None)
    shards = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(shards, local.contiguous())
    return torch.cat(shards, dim=-1)[..., :vocab_size]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", required=True)
    parser.add_argument("--positions", required=True)
    parser.add_argument("--out", required=True)
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
        if dist.get_rank() == 0:
            print("RESULT " + json.dumps({"hf": hf_dir, "tp": config.parallel.tensor_model_parallel_size}), flush=True)
    if dist.get_rank() == 0:
        torch.save(out, args.out)
    distributed.destroy()


if __name__ == "__main__":
    main()
