"""Parameters and state bytes of the plan: from Megatron's own shapes, split as Megatron splits them."""

import pytest

from pretrain.table import SIZES, TABLE1_SIZES, model_preset
from pretrain.plan.params import (StageParams, bytes_per_parameter, megatron_tensors, stage_params, state_bytes,
                                  total_parameters)

# Table 1 writes 10.6M, 42.5M, 113.3M, 424.7M (0.1M steps) and 1082M (1M steps).
TABLE1_STEP = {"10m": 0.1e6, "42m": 0.1e6, "113m": 0.1e6, "425m": 0.1e6, "1b": 1e6}


@pytest.fixture(autouse=True)
def _fresh_builds(monkeypatch, megatron_world):
    monkeypatch.setenv("PRETRAIN_PLAN_CACHE", "0")  # every count here comes from a Megatron build


@pytest.mark.parametrize("size", TABLE1_SIZES)
def test_non_embedding_parameters_of_the_built_model_equal_table_1(size):
    model = model_preset(size)
    total, embedding = total_parameters(model)
    assert total - embedding == model.non_embedding_parameters()
    assert abs((total - embedding) - SIZES[size].table1_params) <= TABLE1_STEP[size] / 2


def test_embedding_is_the_padded_vocabulary_times_hidden_once_when_tied():
    model = model_preset("113m")
    total, embedding = total_parameters(model)
    assert embedding == 50304 * 768  # 50257 padded to a multiple of 128
    assert total == model.total_parameters()


def test_tensor_parallel_rank_holds_split_matrices_and_whole_norms():
    model = model_preset("42m")
    whole = stage_params(model, 1, 1, 0)
    half = stage_params(model, 2, 1, 0)
    norms = sum(n for name, n, _ in whole.tensors if "layernorm" in name)
    layers = lambda stage: sum(n for name, n, _ in stage.tensors if not name.startswith("embedding"))  # noqa: E731
    assert layers(half) == (layers(whole) - norms) // 2 + norms
    # the vocabulary is padded to a multiple of 128 × TP before it is split
    assert half.numel - layers(half) == model.padded_vocab_size(2) * model.hidden_size // 2 == 50432 * 768 // 2


def test_tp_pads_the_vocabulary_to_a_multiple_of_128_times_tp():
    model = model_preset("tiny", vocab_size=300)
    embedding = {t.name: t for t in megatron_tensors(model, 4)}["embedding.word_embeddings.weight"]
    assert embedding.shape[0] == 512  # ceil(300 / 512) * 512


def test_pipeline_stages_split_layers_and_the_last_keeps_a_copy_of_the_tied_embedding():
    model = model_preset("113m")
    first, last = stage_params(model, 1, 2, 0), stage_params(model, 1, 2, 1)
    total, embedding = total_parameters(model)
    assert first.numel + last.numel == total + embedding
    assert any("shared embedding copy" in name for name, _, _ in last.tensors)
    assert not any("shared embedding copy" in name for name, _, _ in stage_params(model, 1, 1, 0).tensors)


def test_bf16_adam_costs_18_bytes_a_parameter_without_the_distributed_optimizer():
    # 2 (bf16 weight) + 4 (fp32 grad) + 4 (fp32 main param) + 4 + 4 (Adam m, v)
    assert bytes_per_parameter(2) == 18
    assert bytes_per_parameter(2, dp=64) == 18  # DP does not shard anything without it


@pytest.mark.parametrize("dp,expected", [(1, 18), (2, 12), (4, 9), (8, 7.5), (32, 6.375)])
def test_distributed_optimizer_costs_6_plus_12_over_dp_bytes_a_parameter(dp, expected):
    assert bytes_per_parameter(2, dp=dp, distributed_optimizer=True) == expected == 6 + 12 / dp


def test_fp32_parameters_have_no_main_copy():
    assert bytes_per_parameter(4) == 16  # 4 + 4 + 8
    assert bytes_per_parameter(4, dp=4, distributed_optimizer=True) == 10  # 4 + 4 + 8 / 4


def test_state_bytes_of_a_hand_worked_stage():
    # 1000 bf16 weights and a 10-element fp32 norm: weights 2000 + 40, grads 4 × 1010,
    # optimizer 1000 × 12 + 10 × 8 = 12080, sharded over DP=4 with the distributed optimizer.
    stage = StageParams(0, [("w", 1000, 2), ("norm", 10, 4)])
    plain = state_bytes(stage, dp=4, distributed_optimizer=False, torch_adam=False)
    assert (plain.weights, plain.grads, plain.optimizer) == (2040, 4040, 12080)
    assert state_bytes(stage, dp=4, distributed_optimizer=True, torch_adam=False).optimizer == 3020
    # torch.optim.AdamW adds a float32 step counter per tensor
    assert state_bytes(stage, dp=4, distributed_optimizer=False, torch_adam=True).optimizer == 12088
