"""Model configuration: Table 1 presets, parameter counts, vocab padding, implementation choice."""

import pytest
import torch

from megatron_ext.model import ModelConfig, ParallelConfig, build_model
from pretrain.table import SIZES, TABLE1_SIZES, model_preset


@pytest.mark.parametrize("name", TABLE1_SIZES)
def test_table1_preset_matches_paper_parameter_count_within_2_percent(name):
    config = model_preset(name)  # counted from the config: nothing is allocated
    expected = SIZES[name].table1_params
    assert config.vocab_size == 50257 and config.seq_length == 2048
    assert abs(config.non_embedding_parameters() - expected) / expected < 0.02


def test_table1_presets_use_swiglu_gqa_and_tied_embeddings():
    config = model_preset("425m")
    assert config.num_query_groups == 4 and config.num_attention_heads == 20
    assert not config.untie_embeddings_and_output_weights


@pytest.mark.parametrize("name,kwargs", [("tiny", {}), ("cpu-small", {}),
                                         ("tiny", {"untie_embeddings_and_output_weights": True}),
                                         ("tiny", {"add_qkv_bias": True})])
def test_parameter_formula_equals_built_megatron_model(megatron_world, name, kwargs):
    config = model_preset(name, **kwargs)
    model = build_model(config)
    assert sum(p.numel() for p in model.parameters()) == config.total_parameters()


def test_vocab_is_padded_to_multiple_of_divisor_times_tp():
    config = model_preset("10m")
    assert config.padded_vocab_size(1) == 50304
    assert config.padded_vocab_size(2) % 256 == 0 and config.padded_vocab_size(2) >= 50257


def test_unknown_preset_names_the_choices():
    with pytest.raises(ValueError, match="unknown model preset 'huge'.*1b"):
        model_preset("huge")


@pytest.mark.parametrize("kwargs,message", [
    ({"num_attention_heads": 6, "num_query_groups": 4}, "num_query_groups"),
    ({"hidden_size": 100, "num_attention_heads": 3}, "kv_channels"),
    ({"transformer_impl": "apex"}, "transformer_impl"),
    ({"fp8": "hybrid"}, "transformer_engine"),
    ({"fp8_recipe": "magic", "transformer_impl": "transformer_engine"}, "fp8_recipe"),
    ({"num_layers": 0}, "num_layers"),
    ({"use_rope_scaling": True, "rope_scaling_low_freq_factor": 4.0}, "low_freq_factor < high_freq_factor"),
    ({"use_rope_scaling": True, "position_embedding_type": "alibi"}, "use_rope_scaling"),
])
def test_invalid_model_config_names_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(**kwargs)


@pytest.mark.parametrize("kwargs,message", [
    ({"tensor_model_parallel_size": 3}, "must divide model.num_attention_heads"),
    ({"pipeline_model_parallel_size": 3}, "must divide model.num_layers"),
])
def test_parallel_layout_is_checked_against_the_model(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ParallelConfig(**kwargs).check_model(model_preset("tiny"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal")
def test_transformer_engine_on_cpu_fails_with_clear_message(megatron_world):
    config = model_preset("tiny", transformer_impl="transformer_engine", bf16=True, fp8="hybrid")
    with pytest.raises(RuntimeError, match="needs a CUDA GPU.*model.transformer_impl=local"):
        build_model(config)


def test_transformer_engine_choice_selects_te_spec_and_fp8_recipe():
    from megatron.core.models.gpt import gpt_layer_specs
    from megatron_ext.model import layer_spec_function, transformer_config

    config = model_preset("tiny", transformer_impl="transformer_engine", bf16=True, fp8="hybrid",
                    fp8_recipe="delayed")
    assert layer_spec_function(config) is gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec
    megatron_config = transformer_config(config)
    assert (megatron_config.fp8, megatron_config.fp8_recipe) == ("hybrid", "delayed")
    assert megatron_config.bf16 and megatron_config.params_dtype == torch.bfloat16
    assert megatron_config.normalization == "RMSNorm" and megatron_config.gated_linear_unit


def test_local_choice_selects_local_spec_in_float32():
    from megatron.core.models.gpt import gpt_layer_specs
    from megatron_ext.model import layer_spec_function, transformer_config

    config = model_preset("tiny")
    assert layer_spec_function(config) is gpt_layer_specs.get_gpt_layer_local_spec
    megatron_config = transformer_config(config)
    assert megatron_config.params_dtype == torch.float32 and megatron_config.fp8 is None
    assert not megatron_config.apply_rope_fusion


def test_per_sample_positions_force_unfused_rope():
    from megatron_ext.model import transformer_config

    config = model_preset("tiny", transformer_impl="transformer_engine")
    assert not transformer_config(config, per_sample_positions=True).apply_rope_fusion


def test_llama3_rope_scaling_equals_megatrons_own_for_llama_3_1_constants(megatron_world):
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    # Megatron's rope_scaling fixes original window 8192 and factors 1 / 4; ours reads them from the config.
    config = model_preset("tiny", kv_channels=128, rotary_base=500000.0, use_rope_scaling=True, rope_scaling_factor=8.0)
    ours = build_model(config).rotary_pos_emb.inv_freq
    megatron = RotaryEmbedding(kv_channels=128, rotary_percent=1.0, rotary_base=500000, rope_scaling=True,
                               rope_scaling_factor=8.0, use_cpu_initialization=True).inv_freq
    torch.testing.assert_close(ours, megatron, rtol=1e-6, atol=0)
    assert not torch.equal(ours, build_model(model_preset("tiny", kv_channels=128, rotary_base=500000.0))
                           .rotary_pos_emb.inv_freq)
