"""The plan against a real Megatron step on this CPU: state bytes exactly, activations within 10 %."""

import pytest

from pretrain.plan.cli import layout_for
from pretrain.plan.estimate import build_plan
from pretrain.plan.measure import measure_step
from pretrain.trainer.config import from_dict

ACTIVATION_TOLERANCE = 0.10  # benchmarks/bench_plan_memory.py records the ratios for 10m/42m/113m


def tiny_plan(bf16: bool):
    config = from_dict({"preset": "tiny", "model": {"seq_length": 64, "bf16": bf16, "transformer_impl": "local"},
                        "schedule": {"micro_batch_size": 2, "global_batch_size": 2, "train_iters": 10}})
    return config, build_plan(config, layout_for(config, 1, 1, None), "h100-80gb")


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_weights_grads_and_optimizer_state_equal_what_megatron_allocates(bf16, megatron_world):
    config, plan = tiny_plan(bf16)
    measured = measure_step(config.model, micro_batch=2)
    stage = plan.stages[0]
    assert (stage.weights, stage.grads, stage.optimizer) == (measured.weights, measured.grads, measured.optimizer)


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_activation_estimate_is_within_tolerance_of_the_profiled_peak(bf16, megatron_world):
    config, plan = tiny_plan(bf16)
    measured = measure_step(config.model, micro_batch=2)
    stage = plan.stages[0]
    predicted = stage.activations + stage.logits + stage.backward_temporaries
    assert abs(measured.activation_peak / predicted - 1) <= ACTIVATION_TOLERANCE
