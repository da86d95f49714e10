"""Device→host syncs per training step under torchrun (TP/PP/DP layouts of parallel_step.py); prints RESULT lines.

Used by tests/trainer/test_host_syncs.py: every rank counts the syncs of each step after the first (which builds
optimizer state) and reports them with their call sites.
"""

import argparse
import json

import torch.distributed as dist

from megatron_ext.model import ParallelConfig
from megatron_ext.positions import PositionConfig, build_sampler
from parallel_step import GLOBAL_BATCH, SEED, rank_microbatches
from pretrain.table import model_preset
from pretrain.trainer import distributed
from pretrain.trainer.config import OptimizerSettings
from pretrain.trainer.engine import Engine
from pretrain.trainer.host_syncs import HostSyncCounter


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--pp", type=int, default=1)
    parser.add_argument("--distributed-optimizer", action="store_true")
    args = parser.parse_args()
    model = model_preset("tiny")
    parallel = ParallelConfig(tensor_model_parallel_size=args.tp, pipeline_model_parallel_size=args.pp,
                              sequence_parallel=args.tp > 1, use_distributed_optimizer=args.distributed_optimizer)
    distributed.initialize(parallel, SEED)
    dp_rank, dp_size = distributed.data_parallel_info()
    sampler = build_sampler(PositionConfig(strategy="posaug"), seed=SEED, train_seq_len=model.seq_length,
                            num_layers=model.num_layers, rotary_dim=model.rotary_dim, rotary_base=model.rotary_base,
                            total_steps=3)
    engine = Engine(model, parallel, OptimizerSettings(lr=1e-3, min_lr=1e-3, lr_decay_style="constant", clip_grad=0.5),
                    train_iters=3)
    syncs, sites = [], []
    for step in range(3):
        data = rank_microbatches(model, step, dp_rank, GLOBAL_BATCH // dp_size, 1)
        counter = HostSyncCounter()
        with counter:
            result = engine.train_step(iter(data), sampler, step, len(data), 1, model.seq_length)
        if step:
            syncs.append(counter.count)
            sites += counter.sites
    print("RESULT " + json.dumps({"rank": dist.get_rank(), "syncs": syncs, "sites": sites,
                                  "updated": result.update_successful}), flush=True)
    distributed.destroy()


if __name__ == "__main__":
    main()
