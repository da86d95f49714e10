"""PositionConfig validation: every bad value is rejected with a message naming the field."""

import pytest

from megatron_ext.positions import PositionConfig, PositionSampler, RopeScaling


def make_sampler(config: PositionConfig, *, train_seq_len: int = 64, num_layers: int = 6) -> PositionSampler:
    return PositionSampler(config, seed=0, train_seq_len=train_seq_len, num_layers=num_layers,
                           rotary_dim=16, rotary_base=10000.0, total_steps=100)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"alpha_min": 0.0}, "positions.alpha_min must be > 0 (got 0)"),
        ({"alpha_min": -1}, "positions.alpha_min must be > 0 (got -1)"),
        ({"alpha_min": 2.0, "alpha_max": 1.0}, "positions.alpha_max must be >= positions.alpha_min=2 (got 1)"),
        ({"alpha_values": ()}, "positions.alpha_values must be a non-empty list of numbers"),
        ({"alpha_values": [1.0, -2.0]}, "positions.alpha_values must be all > 0"),
        ({"alpha_fixed": 0}, "positions.alpha_fixed must be > 0"),
        ({"curriculum_start_min": 0}, "positions.curriculum_start_min must be > 0"),
        ({"curriculum_start_min": 3.0}, "positions.curriculum_start_max must be >= positions.curriculum_start_min=3"),
        ({"curriculum_fraction": 1.5}, "positions.curriculum_fraction must be in [0, 1] (got 1.5)"),
        ({"curriculum_fraction": -0.1}, "positions.curriculum_fraction must be in [0, 1] (got -0.1)"),
        ({"layer_count": -1}, "positions.layer_count must be >= 0 (got -1)"),
        ({"strategy": "posaug", "layer_mode": "bottom", "layer_count": 0}, "positions.layer_count must be >= 1"),
        ({"base_min_factor": 0}, "positions.base_min_factor must be > 0"),
        ({"base_min_factor": 2.0, "base_max_factor": 1.0}, "positions.base_max_factor must be >= positions.base_min_factor"),
        ({"max_position": 0}, "positions.max_position must be in [1, 16777216]"),
        ({"p_head": -0.1}, "positions.p_head must be a probability in [0, 1] (got -0.1)"),
        ({"p_head": 1.5}, "positions.p_head must be a probability in [0, 1] (got 1.5)"),
        ({"p_tail": -0.5}, "positions.p_tail must be a probability in [0, 1] (got -0.5)"),
        ({"p_tail": 2.0}, "positions.p_tail must be a probability in [0, 1] (got 2)"),
        ({"p_head": 0.6, "p_tail": 0.6}, "positions.p_head + positions.p_tail must be <= 1"),
        ({"head_alphas": (0.5, 1.5)}, "(got (0.5, 1.5))"),
        ({"head_alphas": (0.5, 1.5)}, "positions.head_alphas must be all in (0, 1]"),
        ({"head_alpha_fixed": 0.0}, "positions.head_alpha_fixed must be None or in (0, 1]"),
        ({"rope_scaling_factor": 0.5}, "positions.rope_scaling_factor must be None or >= 1 (got 0.5)"),
        ({"per_sample": "maybe"}, "positions.per_sample must be a boolean"),
        ({"strategy": "posaug", "alpha_distribution": "cycle", "granularity": "per_sample"},
         "positions.granularity must be per_step (got per_sample)"),
        ({"alpha_max": "wide"}, "positions.alpha_max must be a number (got 'wide')"),
    ],
)
def test_invalid_numeric_parameter_is_rejected_with_its_field_and_value(overrides, message):
    with pytest.raises(ValueError) as error:
        PositionConfig(**overrides)
    assert message in str(error.value)


@pytest.mark.parametrize(
    "field, value, choices",
    [
        ("strategy", "alibi", "none, posaug, random_base, rfs, rpe, warp, pose, ryarn, drope"),
        ("alpha_distribution", "gaussian", "uniform, log_uniform, discrete, cycle, fixed"),
        ("curriculum", "cosine", "none, linear, step"),
        ("layer_mode", "middle", "all, bottom, top, independent, global"),
        ("tail_function", "cube", "sqrt, beta_2_5"),
        ("rope_scaling", "longrope", "none, pi, ntk, dynamic_ntk, yarn, llama3"),
        ("granularity", "per_microbatch", "per_step, per_sample"),
    ],
)
def test_unknown_choice_is_rejected_with_the_list_of_choices(field, value, choices):
    with pytest.raises(ValueError) as error:
        PositionConfig(**{field: value})
    assert f"positions.{field} must be one of {choices} (got {value!r})" in str(error.value)


def test_rpe_with_max_position_below_seq_len_names_max_position_and_the_fix():
    config = PositionConfig(strategy="rpe", max_position=100)
    with pytest.raises(ValueError) as error:
        config.validate_for(128)
    assert "positions.max_position must be >= the sequence length" in str(error.value)
    assert "set positions.max_position to at least 128" in str(error.value)


def test_rpe_sampler_refuses_a_training_length_above_max_position():
    with pytest.raises(ValueError, match="positions.max_position"):
        make_sampler(PositionConfig(strategy="rpe", max_position=32), train_seq_len=64)


def test_rfs_accepts_max_position_below_seq_len_because_its_positions_are_floats():
    PositionConfig(strategy="rfs", max_position=10).validate_for(4096)


def test_linear_curriculum_requires_a_range_distribution():
    with pytest.raises(ValueError, match="positions.alpha_distribution must be uniform or log_uniform"):
        PositionConfig(strategy="posaug", curriculum="linear", alpha_distribution="discrete")


def test_independent_layer_mode_requires_a_random_distribution():
    with pytest.raises(ValueError, match="positions.alpha_distribution must be uniform, log_uniform or discrete"):
        PositionConfig(strategy="posaug", layer_mode="independent", alpha_distribution="cycle")


def test_layer_mode_other_than_all_requires_posaug():
    with pytest.raises(ValueError, match="positions.layer_mode=top only applies to strategy posaug"):
        PositionConfig(strategy="rfs", layer_mode="top", layer_count=2)


def test_layer_count_above_num_layers_is_rejected_by_the_sampler():
    with pytest.raises(ValueError, match=r"positions.layer_count must be <= num_layers=6 .* \(got 7\)"):
        make_sampler(PositionConfig(strategy="posaug", layer_mode="top", layer_count=7), num_layers=6)


def test_yaml_lists_and_command_line_strings_are_normalised():
    config = PositionConfig(alpha_values=[1, 2, 4], head_alphas="0.5,0.25", alpha_min="0.25",
                            max_position=2048.0)
    assert config.alpha_values == (1.0, 2.0, 4.0)
    assert config.head_alphas == (0.5, 0.25)
    assert config.alpha_min == 0.25
    assert config.max_position == 2048 and isinstance(config.max_position, int)


@pytest.mark.parametrize("legacy, granularity", [(True, "per_sample"), ("false", "per_step")])
def test_legacy_per_sample_field_becomes_granularity(legacy, granularity):
    # Configs saved before positions.granularity existed carry per_sample: true/false.
    config = PositionConfig(strategy="rfs", per_sample=legacy)
    assert config.granularity == granularity and config.per_sample is None


def test_legacy_per_sample_contradicting_granularity_is_rejected():
    with pytest.raises(ValueError, match="positions.per_sample=true contradicts positions.granularity=per_step"):
        PositionConfig(strategy="rfs", per_sample=True, granularity="per_step")


def test_explicit_granularity_overrides_the_strategy_default():
    assert PositionConfig(strategy="rfs", granularity="per_step").granularity == "per_step"
    assert PositionConfig(strategy="posaug", granularity="per_sample").granularity == "per_sample"


def test_default_config_is_the_identity_strategy_with_paper_defaults():
    config = PositionConfig()
    assert config.strategy == "none"
    assert (config.alpha_min, config.alpha_max) == (0.125, 8.0)
    assert config.max_position == 1000
    assert (config.p_head, config.p_tail) == (0.15, 0.15)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"kind": "rope"}, "rope_scaling kind must be one of"),
        ({"kind": "pi", "factor": 0.5}, "rope_scaling factor must be >= 1 (got 0.5)"),
        ({"kind": "yarn", "beta_fast": 1.0, "beta_slow": 32.0}, "0 < beta_slow < beta_fast"),
        ({"kind": "yarn", "original_max_position_embeddings": 0}, "original_max_position_embeddings must be >= 1"),
    ],
)
def test_invalid_rope_scaling_is_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        RopeScaling(**kwargs)


def test_zero_batch_size_is_rejected():
    sampler = make_sampler(PositionConfig(strategy="warp"))
    with pytest.raises(ValueError, match=r"batch_size must be >= 1 \(got 0\)"):
        sampler.training(0, 16, first_sample=0, batch_size=0)


def test_negative_first_sample_is_rejected_because_it_indexes_the_global_batch():
    sampler = make_sampler(PositionConfig(strategy="rfs"))
    with pytest.raises(ValueError, match="first_sample must be >= 0 .* index of the microbatch's first sequence"):
        sampler.training(0, 16, first_sample=-1, batch_size=2)
