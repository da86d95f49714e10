"""Every position strategy end to end through the Megatron model on CPU: finite loss, gradients flow."""

import pytest
import torch

from megatron_ext.model import ParallelConfig
from pretrain.table import model_preset
from megatron_ext.positions import PositionConfig, build_sampler

STRATEGIES = {
    "none": {},
    "posaug": {"strategy": "posaug"},
    "posaug_log_uniform": {"strategy": "posaug", "alpha_distribution": "log_uniform"},
    "posaug_cycle": {"strategy": "posaug", "alpha_distribution": "cycle"},
    "posaug_linear_curriculum": {"strategy": "posaug", "curriculum": "linear"},
    "posaug_step_curriculum": {"strategy": "posaug", "curriculum": "step"},
    "posaug_bottom_2_layers": {"strategy": "posaug", "layer_mode": "bottom", "layer_count": 2},
    "posaug_top_2_layers": {"strategy": "posaug", "layer_mode": "top", "layer_count": 2},
    "posaug_independent_layers": {"strategy": "posaug", "layer_mode": "independent"},
    "posaug_per_sample": {"strategy": "posaug", "granularity": "per_sample"},
    "random_base": {"strategy": "random_base"},
    "random_base_per_sample": {"strategy": "random_base", "granularity": "per_sample"},
    "rfs": {"strategy": "rfs"},
    "rfs_per_step": {"strategy": "rfs", "granularity": "per_step"},
    "rpe": {"strategy": "rpe", "max_position": 256},
    "rpe_per_sample": {"strategy": "rpe", "max_position": 256, "granularity": "per_sample"},
    "warp": {"strategy": "warp", "p_head": 0.5, "p_tail": 0.5},
    "posaug_eval_yarn": {"strategy": "posaug", "rope_scaling": "yarn", "rope_scaling_factor": 4.0},
}


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_strategy_trains_a_step_through_megatron_with_finite_loss_and_gradients(megatron_world, name):
    from pretrain.trainer.config import OptimizerSettings
    from pretrain.trainer.engine import Engine

    model = model_preset("tiny")
    sampler = build_sampler(PositionConfig(**STRATEGIES[name]), seed=3, train_seq_len=model.seq_length,
                            num_layers=model.num_layers, rotary_dim=model.rotary_dim,
                            rotary_base=model.rotary_base, total_steps=10)
    engine = Engine(model, ParallelConfig(), OptimizerSettings(lr=1e-3, min_lr=1e-4), train_iters=10,
                    per_sample_positions=sampler.needs_per_sample)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, model.vocab_size, (2, 2, model.seq_length + 1), generator=g)
    data = [{"tokens": t[:, :-1], "labels": t[:, 1:], "loss_mask": torch.ones(2, model.seq_length)} for t in tokens]
    before = [p.detach().clone() for p in engine.model.module.parameters()]
    result = engine.train_step(iter(data), sampler, step=7, num_microbatches=2, micro_batch_size=2,
                               seq_length=model.seq_length)
    assert torch.isfinite(torch.tensor(result.loss)) and result.grad_norm > 0
    changed = [not torch.equal(b, p) for b, p in zip(before, engine.model.module.parameters())]
    assert all(changed), "every parameter receives a gradient update"
    valid = engine.evaluate(iter(data), sampler, 2, 2, model.seq_length)
    assert torch.isfinite(torch.tensor(valid))
