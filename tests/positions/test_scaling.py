"""Inference-time RoPE transforms agree with transformers' ROPE_INIT_FUNCTIONS."""

import math

import pytest
import torch
from transformers import PretrainedConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from megatron_ext.positions import (PositionConfig, PositionSampler, RopeScaling, rope_inv_freq,
                                    scaled_inv_freq)

ATOL = 1e-6


def hf_rope(rope_type: str, rotary_dim: int, base: float, max_position_embeddings: int,
            seq_len: int | None = None, **parameters) -> tuple[torch.Tensor, float]:
    """transformers' own (inv_freq, attention_factor) for one rope_type."""
    config = PretrainedConfig(hidden_size=rotary_dim * 4, num_attention_heads=4, head_dim=rotary_dim,
                              max_position_embeddings=max_position_embeddings,
                              rope_parameters={"rope_type": rope_type, "rope_theta": base, **parameters})
    return ROPE_INIT_FUNCTIONS[rope_type](config, "cpu", seq_len=seq_len)


def test_rope_inv_freq_is_base_to_the_minus_two_i_over_d():
    expected = torch.tensor([10000.0 ** (-i / 64) for i in range(0, 64, 2)], dtype=torch.float64)
    torch.testing.assert_close(rope_inv_freq(64, 10000.0).double(), expected, rtol=1e-6, atol=0)
    assert rope_inv_freq(64, 10000.0).dtype == torch.float32


def test_no_scaling_returns_the_plain_frequencies():
    inv_freq, attention = scaled_inv_freq(64, 10000.0, RopeScaling(), seq_len=8192)
    assert torch.equal(inv_freq, rope_inv_freq(64, 10000.0)) and attention == 1.0


@pytest.mark.parametrize("rotary_dim, base, original, factor", [
    (64, 10000.0, 2048, 4.0), (128, 500000.0, 4096, 8.0), (32, 10000.0, 512, 2.5), (64, 10000.0, 2048, 1.0),
])
def test_yarn_matches_transformers(rotary_dim, base, original, factor):
    expected, expected_attention = hf_rope("yarn", rotary_dim, base, original, factor=factor,
                                           original_max_position_embeddings=original, beta_fast=32.0, beta_slow=1.0)
    scaling = RopeScaling("yarn", factor=factor, original_max_position_embeddings=original)
    inv_freq, attention = scaled_inv_freq(rotary_dim, base, scaling, seq_len=int(original * factor))
    torch.testing.assert_close(inv_freq, expected, rtol=0, atol=ATOL)
    assert attention == pytest.approx(expected_attention, abs=ATOL)


@pytest.mark.parametrize("rotary_dim, base, original, factor, low, high", [
    (128, 500000.0, 8192, 8.0, 1.0, 4.0),  # Llama 3.1
    (64, 500000.0, 8192, 32.0, 1.0, 4.0),  # Llama 3.2
    (16, 10000.0, 32, 4.0, 1.0, 4.0), (64, 10000.0, 2048, 2.0, 0.5, 3.0),
])
def test_llama3_matches_transformers_bit_for_bit(rotary_dim, base, original, factor, low, high):
    expected, expected_attention = hf_rope("llama3", rotary_dim, base, original * 4, factor=factor,
                                           low_freq_factor=low, high_freq_factor=high,
                                           original_max_position_embeddings=original)
    scaling = RopeScaling("llama3", factor=factor, original_max_position_embeddings=original, low_freq_factor=low,
                          high_freq_factor=high)
    inv_freq, attention = scaled_inv_freq(rotary_dim, base, scaling, seq_len=original * 4)
    assert torch.equal(inv_freq, expected) and attention == expected_attention == 1.0


def test_llama3_keeps_high_frequencies_and_divides_low_ones_by_the_factor():
    plain = rope_inv_freq(16, 10000.0)
    scaled, _ = scaled_inv_freq(16, 10000.0, RopeScaling("llama3", factor=4.0, original_max_position_embeddings=32),
                                seq_len=96)
    wavelength = 2 * math.pi / plain
    assert torch.equal(scaled[wavelength < 8], plain[wavelength < 8])
    torch.testing.assert_close(scaled[wavelength > 32], plain[wavelength > 32] / 4)
    medium = (wavelength >= 8) & (wavelength <= 32)
    assert medium.any() and bool(((scaled[medium] < plain[medium]) & (scaled[medium] > plain[medium] / 4)).all())


def test_llama3_needs_low_below_high_frequency_factor():
    with pytest.raises(ValueError, match="low_freq_factor < high_freq_factor"):
        RopeScaling("llama3", factor=8.0, low_freq_factor=4.0, high_freq_factor=1.0)


def test_yarn_with_non_default_betas_matches_transformers():
    expected, expected_attention = hf_rope("yarn", 64, 10000.0, 1024, factor=4.0,
                                           original_max_position_embeddings=1024, beta_fast=16.0, beta_slow=2.0)
    scaling = RopeScaling("yarn", factor=4.0, original_max_position_embeddings=1024, beta_fast=16.0, beta_slow=2.0)
    inv_freq, attention = scaled_inv_freq(64, 10000.0, scaling, seq_len=4096)
    torch.testing.assert_close(inv_freq, expected, rtol=0, atol=ATOL)
    assert attention == pytest.approx(expected_attention, abs=ATOL)


def test_yarn_attention_factor_is_one_tenth_log_s_plus_one():
    _, attention = scaled_inv_freq(64, 10000.0, RopeScaling("yarn", factor=8.0, original_max_position_embeddings=2048), 16384)
    assert attention == pytest.approx(0.1 * math.log(8.0) + 1.0)


def test_yarn_keeps_high_frequencies_and_interpolates_low_frequencies():
    plain = rope_inv_freq(64, 10000.0)
    scaled, _ = scaled_inv_freq(64, 10000.0, RopeScaling("yarn", factor=4.0, original_max_position_embeddings=2048), 8192)
    assert scaled[0] == plain[0]
    torch.testing.assert_close(scaled[-1], plain[-1] / 4)


@pytest.mark.parametrize("factor", [2.0, 4.0, 16.0])
def test_pi_matches_transformers_linear_scaling(factor):
    expected, _ = hf_rope("linear", 64, 10000.0, 2048, factor=factor)
    inv_freq, attention = scaled_inv_freq(64, 10000.0, RopeScaling("pi", factor=factor), seq_len=8192)
    torch.testing.assert_close(inv_freq, expected, rtol=0, atol=ATOL)
    assert attention == 1.0


def test_pi_on_frequencies_equals_dividing_positions_by_the_factor():
    positions = torch.arange(4096, dtype=torch.float32)
    inv_freq, _ = scaled_inv_freq(64, 10000.0, RopeScaling("pi", factor=4.0), seq_len=4096)
    torch.testing.assert_close(torch.outer(positions, inv_freq),
                               torch.outer(positions / 4.0, rope_inv_freq(64, 10000.0)))


@pytest.mark.parametrize("factor, seq_len", [(1.0, 8192), (2.0, 8192), (4.0, 16384), (2.0, 1024)])
def test_dynamic_ntk_matches_transformers(factor, seq_len):
    expected, _ = hf_rope("dynamic", 64, 10000.0, 2048, seq_len=seq_len, factor=factor)
    scaling = RopeScaling("dynamic_ntk", factor=factor, original_max_position_embeddings=2048)
    inv_freq, attention = scaled_inv_freq(64, 10000.0, scaling, seq_len=seq_len)
    torch.testing.assert_close(inv_freq, expected, rtol=0, atol=ATOL)
    assert attention == 1.0


def test_dynamic_ntk_without_a_factor_grows_with_the_evaluation_length():
    scaling = RopeScaling("dynamic_ntk", original_max_position_embeddings=2048)
    at_train_len, _ = scaled_inv_freq(64, 10000.0, scaling, seq_len=2048)
    longer, _ = scaled_inv_freq(64, 10000.0, scaling, seq_len=8192)
    assert torch.equal(at_train_len, rope_inv_freq(64, 10000.0))
    assert torch.all(longer[1:] < at_train_len[1:])


@pytest.mark.parametrize("rotary_dim, factor", [(64, 4.0), (128, 8.0)])
def test_ntk_aware_multiplies_the_base_by_s_to_the_d_over_d_minus_2(rotary_dim, factor):
    inv_freq, attention = scaled_inv_freq(rotary_dim, 10000.0, RopeScaling("ntk", factor=factor), seq_len=8192)
    expected = rope_inv_freq(rotary_dim, 10000.0 * factor ** (rotary_dim / (rotary_dim - 2)))
    torch.testing.assert_close(inv_freq, expected, rtol=0, atol=ATOL)
    # It is transformers' dynamic NTK (factor 1) evaluated at s times the original length.
    hf, _ = hf_rope("dynamic", rotary_dim, 10000.0, 2048, seq_len=int(2048 * factor), factor=1.0)
    torch.testing.assert_close(inv_freq, hf, rtol=0, atol=ATOL)
    assert attention == 1.0


def test_factor_defaults_to_eval_length_over_training_length():
    scaling = RopeScaling("pi", original_max_position_embeddings=2048)
    inv_freq, _ = scaled_inv_freq(64, 10000.0, scaling, seq_len=8192)
    torch.testing.assert_close(inv_freq, rope_inv_freq(64, 10000.0) / 4)
    assert scaling.resolve_factor(1024) == 1.0  # never shrinks below the training length


def test_missing_training_length_for_a_derived_factor_is_an_error():
    with pytest.raises(ValueError, match="original_max_position_embeddings"):
        scaled_inv_freq(64, 10000.0, RopeScaling("yarn", factor=4.0), seq_len=8192)


@pytest.mark.parametrize("strategy", ["posaug", "rfs", "warp"])
def test_sampler_evaluation_applies_yarn_on_top_of_the_strategy(strategy):
    config = PositionConfig(strategy=strategy, rope_scaling="yarn")
    sampler = PositionSampler(config, seed=0, train_seq_len=256, num_layers=2, rotary_dim=32,
                              rotary_base=10000.0, total_steps=10)
    rope = sampler.evaluation(seq_len=1024)
    expected, expected_attention = hf_rope("yarn", 32, 10000.0, 256, factor=4.0, original_max_position_embeddings=256)
    torch.testing.assert_close(rope.inv_freq, expected, rtol=0, atol=ATOL)
    assert rope.attention_factor == pytest.approx(expected_attention)
    plain = PositionSampler(PositionConfig(strategy=strategy), seed=0, train_seq_len=256, num_layers=2,
                            rotary_dim=32, rotary_base=10000.0, total_steps=10).evaluation(seq_len=1024)
    assert torch.equal(rope.positions, plain.positions)


def test_sampler_evaluation_uses_an_explicit_scaling_factor():
    config = PositionConfig(strategy="posaug", rope_scaling="ntk", rope_scaling_factor=8.0)
    sampler = PositionSampler(config, seed=0, train_seq_len=256, num_layers=2, rotary_dim=32,
                              rotary_base=10000.0, total_steps=10)
    torch.testing.assert_close(sampler.evaluation(seq_len=512).inv_freq,
                               rope_inv_freq(32, 10000.0 * 8.0 ** (32 / 30)), rtol=0, atol=ATOL)
