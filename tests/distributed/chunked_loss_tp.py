"""Under torchrun (gloo, CPU): the chunked loss against Megatron's loss at TP = 2, with and without sequence
parallelism; prints one 'RESULT {...}' per (rank, layout) with the largest loss and gradient differences.

Used by tests/megatron_ext/test_chunked_loss.py. Both models of a layout are built from the same seed (CPU
initialisation: the same weights as one process), run the same tokens and positions with labels, and backpropagate
the mean loss; each rank compares its own shards.
"""

import json

import torch
import torch.distributed as dist

from megatron_ext.model import ParallelConfig, build_model
from pretrain.table import model_preset
from pretrain.trainer import distributed

B, S = 2, 16


def loss_and_grads(chunked: bool, parallel: ParallelConfig) -> tuple[torch.Tensor, dict]:
    torch.manual_seed(0)
    model = build_model(model_preset("tiny", cross_entropy_loss_fusion=chunked), parallel)
    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, 256, (B, S + 1), generator=g)
    positions = torch.arange(S, dtype=torch.float32) * 2.5
    loss = model(tokens[:, :-1], positions, None, labels=tokens[:, 1:])
    loss.mean().backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


def main() -> None:
    distributed.initialize(ParallelConfig(tensor_model_parallel_size=2), seed=1234)
    for layout, parallel in [("tp2", ParallelConfig(tensor_model_parallel_size=2)),
                             ("tp2_sp", ParallelConfig(tensor_model_parallel_size=2, sequence_parallel=True))]:
        loss_stock, grads_stock = loss_and_grads(False, parallel)
        loss_chunked, grads_chunked = loss_and_grads(True, parallel)
        record = {"rank": dist.get_rank(), "layout": layout, "loss": float(loss_stock.mean()),
                  "loss_diff": float((loss_chunked - loss_stock).abs().max()),
                  "grad_diff": max(float((grads_chunked[n] - g).abs().max()) for n, g in grads_stock.items()),
                  "grad_scale": max(float(g.abs().max()) for g in grads_stock.values()),
                  "params": len(grads_stock)}
        print("RESULT " + json.dumps(record), flush=True)
    distributed.destroy()


if __name__ == "__main__":
    main()
