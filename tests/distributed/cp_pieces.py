"""The CPU-testable pieces of context parallelism, under torchrun with a real CP group (gloo).

CP attention itself needs Transformer Engine (GPU). Here every rank slices hand-made batches,
positions and per-token losses with megatron_ext.context_parallel and rank 0 prints what the
test checks: each rank's token indices, whether its angles are those of its own tokens'
positions, and the reduced losses and gradients next to the full-sequence ones.
"""

import json
import os

import torch
import torch.distributed as dist

from megatron_ext import context_parallel
from megatron_ext.model import ParallelConfig
from megatron_ext.positions import PositionConfig, build_sampler, rope_inv_freq
from megatron_ext.rope_hook import rotary_angles
from pretrain.trainer import distributed
from pretrain.trainer.engine import _reduce_loss

B, S, LAYERS, ROTARY_DIM, SEED = 3, 16, 4, 16, 7
POSITION_CONFIGS = {
    "rfs_per_sample": {"strategy": "rfs"},
    "posaug_top_per_sample": {"strategy": "posaug", "layer_mode": "top", "layer_count": 2,
                              "granularity": "per_sample"},
    "random_base_per_sample": {"strategy": "random_base", "granularity": "per_sample"},
    "warp_per_step": {"strategy": "warp", "granularity": "per_step", "p_head": 1.0, "p_tail": 0.0},
}


def report(record: dict) -> None:
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, record)
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps({"kind": record["kind"], "ranks": gathered}), flush=True)


def token_slices(cp_group) -> torch.Tensor:
    """Each rank's slice of tokens = column index (so a slice names its own token positions)."""
    columns = torch.arange(S).expand(B, S)
    batch = {"tokens": columns, "labels": columns + 100, "loss_mask": columns.float()}
    sliced = context_parallel.slice_batch(batch, cp_group)
    report({"kind": "slices", "tokens": sliced["tokens"].tolist(), "labels": sliced["labels"].tolist(),
            "loss_mask": sliced["loss_mask"].tolist()})
    return sliced["tokens"][0]


def angles_of_own_tokens(cp_group, own: torch.Tensor) -> None:
    for name, fields in POSITION_CONFIGS.items():
        sampler = build_sampler(PositionConfig(**fields), seed=SEED, train_seq_len=S, num_layers=LAYERS,
                                rotary_dim=ROTARY_DIM, rotary_base=10000.0, total_steps=10)
        full = sampler.training(2, S, first_sample=5, batch_size=B)
        mine = context_parallel.slice_positions(full, cp_group)
        inv_freq = full.inv_freq if full.inv_freq is not None else rope_inv_freq(ROTARY_DIM, 10000.0)
        worst = 0.0
        for layer in range(1, LAYERS + 1):
            got = rotary_angles(mine.for_layer(layer), inv_freq)
            expected = rotary_angles(full.for_layer(layer)[..., own], inv_freq)
            worst = max(worst, (got - expected).abs().max().item())
        report({"kind": "angles", "strategy": name, "shape": list(mine.positions.shape), "max_diff": worst})


def loss_reduction(cp_group) -> None:
    g = torch.Generator().manual_seed(SEED)
    per_token = torch.rand(B, S, generator=g, dtype=torch.float64).float() * 5
    mask = (torch.rand(B, S, generator=g) < 0.6).float()  # uneven per rank on purpose
    full_loss = (per_token * mask).sum() / mask.sum()
    full_grad = mask / mask.sum()
    mine = context_parallel.slice_batch({"loss": per_token, "mask": mask, "grad": full_grad}, cp_group)
    local = mine["loss"].clone().requires_grad_(True)
    loss, reported = context_parallel.masked_mean_loss(local, mine["mask"], cp_group)
    loss.backward()
    summed = loss.detach().clone()
    dist.all_reduce(summed, group=cp_group)
    engine_loss, _ = _reduce_loss([{"lm loss": reported, "microbatch": 0}])
    report({"kind": "loss", "full": full_loss.item(), "reported": reported.item(), "summed": summed.item(),
            "engine": engine_loss, "grad_diff": (local.grad - mine["grad"]).abs().max().item(),
            "local_mean": (mine["loss"] * mine["mask"]).sum().item() / max(mine["mask"].sum().item(), 1.0)})


def main():
    # Every process in one CP group: CP = world size.
    distributed.initialize(ParallelConfig(context_parallel_size=int(os.environ["WORLD_SIZE"])), SEED)
    from megatron.core import parallel_state

    cp_group = parallel_state.get_context_parallel_group()
    own = token_slices(cp_group)
    angles_of_own_tokens(cp_group, own)
    loss_reduction(cp_group)
    distributed.destroy()


if __name__ == "__main__":
    main()
