"""Cluster knobs (Megatron names): activation recomputation, overlapped grad/param communication,
interleaved pipeline. Recompute runs in-process; the communication knobs under torchrun (gloo, CPU).
Runtime: ~10 s in-process, ~35 s for the DP=2 launch, ~40 s for the PP=2 × VP=2 launches.
"""

import pytest
import torch

from conftest import run_torchrun
from megatron_ext.model import ParallelConfig, build_model
from megatron_ext.positions import PositionConfig, build_sampler
from pretrain.table import model_preset
from pretrain.trainer.config import from_dict

SCRIPT = "tests/distributed/knobs_step.py"
TOLERANCE = 1e-5
RECOMPUTE = {
    "full_uniform_1": {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1},
    "full_uniform_2": {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 2},
    "full_block_3": {"recompute_granularity": "full", "recompute_method": "block", "recompute_num_layers": 3},
    "selective": {"recompute_granularity": "selective"},
}
PER_LAYER = {"independent": {"layer_mode": "independent"},
             "bottom_1": {"layer_mode": "bottom", "layer_count": 1},
             "top_2": {"layer_mode": "top", "layer_count": 2}}


def loss_and_gradients(knobs, positions, state):
    """Loss and every parameter's gradient of one forward/backward of the tiny model in train mode."""
    model = build_model(model_preset("tiny", **knobs))
    model.load_state_dict(state)
    g = torch.Generator().manual_seed(11)
    tokens = torch.randint(0, 256, (2, 65), generator=g)
    loss = model(tokens[:, :-1], positions, None, labels=tokens[:, 1:]).mean()
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.fixture(scope="module")
def reference_state(megatron_world):
    torch.manual_seed(0)
    return build_model(model_preset("tiny")).state_dict()


@pytest.mark.parametrize("layer_mode", list(PER_LAYER))
@pytest.mark.parametrize("recompute", list(RECOMPUTE))
def test_recompute_gives_the_loss_and_gradients_of_no_recompute_with_per_layer_positions(
        reference_state, recompute, layer_mode):
    model = model_preset("tiny")
    sampler = build_sampler(PositionConfig(strategy="posaug", alpha_min=0.25, alpha_max=8.0, **PER_LAYER[layer_mode]),
                            seed=5, train_seq_len=64, num_layers=model.num_layers, rotary_dim=model.rotary_dim,
                            rotary_base=model.rotary_base, total_steps=10)
    positions = sampler.training(3, 64, first_sample=0, batch_size=1)
    assert positions.layer_positions is not None
    loss, gradients = loss_and_gradients({}, positions, reference_state)
    got_loss, got_gradients = loss_and_gradients(RECOMPUTE[recompute], positions, reference_state)
    torch.testing.assert_close(got_loss, loss, atol=1e-6, rtol=0)
    for name, gradient in gradients.items():
        torch.testing.assert_close(got_gradients[name], gradient, atol=1e-6, rtol=1e-5, msg=name)


def test_recompute_settings_reach_megatron_transformer_config(megatron_world):
    model = build_model(model_preset("tiny", **RECOMPUTE["full_block_3"]))
    assert (model.config.recompute_granularity, model.config.recompute_method,
            model.config.recompute_num_layers) == ("full", "block", 3)


@pytest.mark.parametrize("fields,message", [
    ({"recompute_granularity": "everything"}, "recompute_granularity must be null, full or selective"),
    ({"recompute_granularity": "full"}, "needs model.recompute_method"),
    ({"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 0},
     "recompute_num_layers must be >= 1"),
    ({"recompute_granularity": "selective", "recompute_num_layers": 2}, "apply only to model.recompute_granularity=full"),
    ({"recompute_method": "lazy"}, "recompute_method must be null, uniform or block"),
], ids=["granularity", "full_without_method", "zero_layers", "selective_with_layers", "method"])
def test_invalid_recompute_settings_are_refused_naming_the_field(fields, message):
    with pytest.raises(ValueError, match=message):
        model_preset("tiny", **fields)


@pytest.mark.parametrize("model,message", [
    ({"recompute_method": "block", "recompute_num_layers": 3}, "between 1 and the 2 layers of a pipeline stage"),
    ({"num_layers": 6, "recompute_method": "uniform", "recompute_num_layers": 2}, "must divide the 3 layers"),
], ids=["more_than_a_stage", "uniform_not_dividing"])
def test_recompute_layers_are_checked_against_the_pipeline_stage(model, message):
    config = from_dict({"preset": "tiny", "model": {"recompute_granularity": "full", **model},
                        "parallel": {"pipeline_model_parallel_size": 2}, "data": {"synthetic": True},
                        "schedule": {"train_iters": 2, "global_batch_size": 8, "micro_batch_size": 2}})
    with pytest.raises(ValueError, match=message):
        config.validate(world_size=2)


@pytest.mark.parametrize("fields,message", [
    ({"overlap_param_gather": True, "overlap_grad_reduce": True}, "needs parallel.use_distributed_optimizer=true"),
    ({"overlap_param_gather": True, "use_distributed_optimizer": True}, "needs parallel.overlap_grad_reduce=true"),
    ({"virtual_pipeline_model_parallel_size": 2}, "needs parallel.pipeline_model_parallel_size > 1"),
    ({"virtual_pipeline_model_parallel_size": 0}, "must be >= 1 or null"),
], ids=["param_gather_without_distributed_optimizer", "param_gather_without_grad_overlap", "vp_without_pp",
        "vp_zero"])
def test_invalid_parallel_knobs_are_refused_naming_the_field(fields, message):
    with pytest.raises(ValueError, match=message):
        ParallelConfig(**fields)


def test_virtual_pipeline_needs_layers_divisible_by_stages_times_chunks():
    with pytest.raises(ValueError, match=r"divisible by PP × VP = 2 × 4"):
        ParallelConfig(pipeline_model_parallel_size=2,
                       virtual_pipeline_model_parallel_size=4).check_model(model_preset("tiny"))


@pytest.mark.slow
def test_overlapped_grad_reduce_and_param_gather_give_the_plain_dp2_steps():
    records = run_torchrun(SCRIPT, 2, "--layout", "dp2", timeout=300)
    by_variant = {}
    for record in records:
        by_variant.setdefault(record["variant"], []).append(record)
    assert set(by_variant) == {"plain", "overlap_grad_reduce", "distributed_optimizer", "overlap_param_gather"}
    for variant, reference in (("overlap_grad_reduce", "plain"), ("overlap_param_gather", "distributed_optimizer")):
        assert len(by_variant[variant]) == len(by_variant[reference]) == 3
        for got, expected in zip(by_variant[variant], by_variant[reference]):
            assert abs(got["loss"] - expected["loss"]) <= TOLERANCE * abs(expected["loss"]), variant
            assert abs(got["grad_norm"] - expected["grad_norm"]) <= TOLERANCE * expected["grad_norm"], variant
            for name, value in expected["parameters"].items():
                assert abs(got["parameters"][name] - value) <= TOLERANCE * max(1.0, value), (variant, name)


@pytest.mark.slow
def test_interleaved_pipeline_pp2_vp2_gives_one_process_loss_and_parameters():
    one_process = run_torchrun(SCRIPT, 1, "--layout", "vp", timeout=300)
    interleaved = run_torchrun(SCRIPT, 2, "--layout", "vp", timeout=300)
    assert len(one_process) == len(interleaved) == 3
    for got, expected in zip(interleaved, one_process):
        assert got["variant"] == "pp2_vp2"
        assert abs(got["loss"] - expected["loss"]) <= TOLERANCE * abs(expected["loss"])
        assert got["parameters"].keys() == expected["parameters"].keys()
        for name, value in expected["parameters"].items():
            assert abs(got["parameters"][name] - value) <= TOLERANCE * max(1.0, value), name


def test_interleaved_pipeline_needs_microbatches_in_multiples_of_the_pipeline_size():
    config = from_dict({"preset": "tiny", "parallel": {"pipeline_model_parallel_size": 2,
                                                       "virtual_pipeline_model_parallel_size": 2},
                        "data": {"synthetic": True},
                        "schedule": {"train_iters": 2, "global_batch_size": 6, "micro_batch_size": 2}})
    with pytest.raises(ValueError, match="multiple of parallel.pipeline_model_parallel_size"):
        config.validate(world_size=2)
