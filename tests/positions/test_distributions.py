"""PosAug alpha distributions and curricula; random_base base distribution."""

from collections import Counter

import pytest
import scipy.stats

from megatron_ext.positions import PositionConfig, PositionSampler

DRAWS = 2000
P_MIN = 1e-3  # seeds are fixed, so these tests are deterministic; the threshold only sets power


def make_sampler(seed: int = 0, total_steps: int = 10_000, **fields) -> PositionSampler:
    return PositionSampler(PositionConfig(strategy="posaug", **fields), seed=seed, train_seq_len=64,
                           num_layers=6, rotary_dim=16, rotary_base=10000.0, total_steps=total_steps)


def alphas(sampler: PositionSampler, steps=range(DRAWS)) -> list[float]:
    return [sampler.sample_alpha(step) for step in steps]


def test_uniform_alpha_passes_a_ks_test_against_uniform_a_b():
    draws = alphas(make_sampler(alpha_min=0.125, alpha_max=8.0))
    assert scipy.stats.kstest(draws, scipy.stats.uniform(0.125, 8.0 - 0.125).cdf).pvalue > P_MIN


def test_log_uniform_alpha_passes_a_ks_test_against_log_uniform_a_b():
    draws = alphas(make_sampler(alpha_distribution="log_uniform"))
    assert scipy.stats.kstest(draws, scipy.stats.loguniform(0.125, 8.0).cdf).pvalue > P_MIN


def test_log_uniform_alpha_is_distinguishable_from_uniform():
    draws = alphas(make_sampler(alpha_distribution="log_uniform"))
    assert scipy.stats.kstest(draws, scipy.stats.uniform(0.125, 8.0 - 0.125).cdf).pvalue < 1e-6
    # Equal mass per octave: half the draws lie below the geometric midpoint 1.
    assert 0.45 < sum(a < 1.0 for a in draws) / len(draws) < 0.55


def test_discrete_alpha_draws_each_value_with_equal_frequency():
    draws = alphas(make_sampler(alpha_distribution="discrete", alpha_values=(1.0, 2.0, 4.0, 8.0)))
    counts = Counter(draws)
    assert set(counts) == {1.0, 2.0, 4.0, 8.0}
    assert scipy.stats.chisquare([counts[v] for v in (1.0, 2.0, 4.0, 8.0)]).pvalue > P_MIN


def test_cycle_alpha_follows_the_values_in_step_order():
    sampler = make_sampler(alpha_distribution="cycle", alpha_values=(1.0, 2.0, 4.0, 8.0))
    assert alphas(sampler, range(9)) == [1.0, 2.0, 4.0, 8.0, 1.0, 2.0, 4.0, 8.0, 1.0]


def test_fixed_alpha_is_constant():
    assert set(alphas(make_sampler(alpha_distribution="fixed", alpha_fixed=4.0), range(50))) == {4.0}


def test_alpha_changes_from_step_to_step():
    draws = alphas(make_sampler(), range(100))
    assert len(set(draws)) == 100


def test_independent_layer_alphas_are_uniform_on_a_b():
    sampler = make_sampler(layer_mode="independent", alpha_min=0.25, alpha_max=4.0)
    draws = [a for step in range(DRAWS // 6) for a in sampler.sample_layer_alphas(step).tolist()]
    assert scipy.stats.kstest(draws, scipy.stats.uniform(0.25, 4.0 - 0.25).cdf).pvalue > P_MIN


def test_independent_discrete_layer_alphas_only_take_the_listed_values():
    sampler = make_sampler(layer_mode="independent", alpha_distribution="discrete", alpha_values=(0.5, 2.0))
    draws = [a for step in range(100) for a in sampler.sample_layer_alphas(step).tolist()]
    assert set(draws) == {0.5, 2.0}


def test_linear_curriculum_starts_at_half_to_two_and_ends_at_a_b():
    sampler = make_sampler(curriculum="linear", alpha_min=0.125, alpha_max=8.0, total_steps=1001)
    assert sampler.alpha_range(0) == (0.5, 2.0)
    assert sampler.alpha_range(500) == pytest.approx(((0.5 + 0.125) / 2, (2.0 + 8.0) / 2))
    assert sampler.alpha_range(1000) == (0.125, 8.0)
    assert sampler.alpha_range(5000) == (0.125, 8.0)  # past total_steps: stays at the target


def test_linear_curriculum_first_step_alpha_is_uniform_on_half_to_two():
    draws = [make_sampler(seed=seed, curriculum="linear").sample_alpha(0) for seed in range(DRAWS)]
    assert min(draws) >= 0.5 and max(draws) <= 2.0
    assert scipy.stats.kstest(draws, scipy.stats.uniform(0.5, 1.5).cdf).pvalue > P_MIN


def test_linear_curriculum_final_step_alpha_is_uniform_on_a_b():
    draws = [make_sampler(seed=seed, curriculum="linear", total_steps=100).sample_alpha(99) for seed in range(DRAWS)]
    assert scipy.stats.kstest(draws, scipy.stats.uniform(0.125, 8.0 - 0.125).cdf).pvalue > P_MIN


def test_step_curriculum_keeps_alpha_one_before_the_fraction_and_varies_after():
    sampler = make_sampler(curriculum="step", curriculum_fraction=0.5, total_steps=200)
    assert set(alphas(sampler, range(100))) == {1.0}
    after = alphas(sampler, range(100, 200))
    assert len(set(after)) == 100 and min(after) >= 0.125 and max(after) <= 8.0


def test_step_curriculum_also_holds_independent_layer_alphas_at_one():
    sampler = make_sampler(curriculum="step", layer_mode="independent", total_steps=10)
    assert sampler.sample_layer_alphas(4).tolist() == [1.0] * 6
    assert len(set(sampler.sample_layer_alphas(5).tolist())) == 6


def test_step_curriculum_with_log_uniform_samples_log_uniform_after_the_switch():
    sampler = make_sampler(curriculum="step", alpha_distribution="log_uniform", total_steps=2 * DRAWS)
    draws = alphas(sampler, range(DRAWS, 2 * DRAWS))
    assert scipy.stats.kstest(draws, scipy.stats.loguniform(0.125, 8.0).cdf).pvalue > P_MIN


def test_random_base_is_uniform_between_the_base_factors():
    sampler = PositionSampler(PositionConfig(strategy="random_base"), seed=0, train_seq_len=64, num_layers=2,
                              rotary_dim=16, rotary_base=10000.0, total_steps=DRAWS)
    bases = [sampler.sample_base(step) for step in range(DRAWS)]
    assert scipy.stats.kstest(bases, scipy.stats.uniform(1250.0, 80000.0 - 1250.0).cdf).pvalue > P_MIN
    # The draws fill the whole [B0 / 8, 8 B0] range (expected edge gap ~ 40 for 2000 draws).
    assert 1250.0 <= min(bases) < 1250.0 + 400 and 80000.0 - 400 < max(bases) <= 80000.0
