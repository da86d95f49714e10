"""Structure, shapes, dtypes and devices of the positions each strategy builds."""

import math

import pytest
import scipy.stats
import torch

from megatron_ext.positions import PositionConfig, PositionSampler, RopePositions, rope_inv_freq
from megatron_ext.positions.strategies import skew

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
NUM_LAYERS = 6
ROTARY_DIM = 16
TRAIN_LEN = 64


def make_sampler(total_steps: int = 100, **fields) -> PositionSampler:
    return PositionSampler(PositionConfig(**fields), seed=1234, train_seq_len=TRAIN_LEN,
                           num_layers=NUM_LAYERS, rotary_dim=ROTARY_DIM, rotary_base=10000.0,
                           total_steps=total_steps)


# (config fields, expected positions shape for seq_len=32, batch_size=3)
STRATEGY_CASES = {
    "none": ({"strategy": "none"}, (32,)),
    "posaug": ({"strategy": "posaug"}, (32,)),
    "posaug_bottom": ({"strategy": "posaug", "layer_mode": "bottom", "layer_count": 2}, (32,)),
    "posaug_independent": ({"strategy": "posaug", "layer_mode": "independent"}, (32,)),
    "random_base": ({"strategy": "random_base"}, (32,)),
    "rfs": ({"strategy": "rfs"}, (3, 32)),
    "rfs_per_step": ({"strategy": "rfs", "granularity": "per_step"}, (32,)),
    "rpe": ({"strategy": "rpe", "max_position": 256}, (32,)),
    "rpe_per_sample": ({"strategy": "rpe", "max_position": 256, "granularity": "per_sample"}, (3, 32)),
    "warp": ({"strategy": "warp"}, (3, 32)),
    "warp_per_step": ({"strategy": "warp", "granularity": "per_step"}, (32,)),
    "posaug_per_sample": ({"strategy": "posaug", "granularity": "per_sample"}, (3, 32)),
    "posaug_bottom_per_sample": ({"strategy": "posaug", "layer_mode": "bottom", "layer_count": 2,
                                  "granularity": "per_sample"}, (32,)),
    "posaug_independent_per_sample": ({"strategy": "posaug", "layer_mode": "independent",
                                       "granularity": "per_sample"}, (32,)),
    "random_base_per_sample": ({"strategy": "random_base", "granularity": "per_sample"}, (32,)),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", sorted(STRATEGY_CASES))
def test_training_positions_are_float32_on_the_requested_device_with_the_documented_shape(case, device):
    fields, shape = STRATEGY_CASES[case]
    sampler = make_sampler(**fields)
    rope = sampler.training(step=5, seq_len=32, first_sample=0, batch_size=3, device=device)
    assert isinstance(rope, RopePositions)
    assert rope.positions.shape == shape
    assert rope.positions.dtype == torch.float32
    assert rope.positions.device.type == device
    assert sampler.needs_per_sample == rope.per_sample == (sampler.config.granularity == "per_sample")
    batch = (3,) if rope.per_sample else ()
    if rope.layer_positions is not None:
        assert rope.layer_positions.shape == (NUM_LAYERS, *batch, 32)
        assert rope.layer_positions.dtype == torch.float32
        assert rope.layer_positions.device.type == device
    if rope.inv_freq is not None:
        assert rope.inv_freq.shape == (*batch, ROTARY_DIM // 2)
        assert rope.inv_freq.dtype == torch.float32
        assert rope.inv_freq.device.type == device


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", sorted(STRATEGY_CASES))
@pytest.mark.parametrize("rope_scaling", ["none", "yarn"])
def test_evaluation_positions_are_float32_on_the_requested_device(case, device, rope_scaling):
    fields, _ = STRATEGY_CASES[case]
    sampler = make_sampler(**fields, rope_scaling=rope_scaling)
    rope = sampler.evaluation(seq_len=128, device=device)
    assert rope.positions.shape == (128,)
    assert rope.positions.dtype == torch.float32
    assert rope.positions.device.type == device
    assert rope.layer_positions is None
    if rope_scaling == "none":
        assert rope.inv_freq is None and rope.attention_factor == 1.0
    else:
        assert rope.inv_freq.shape == (ROTARY_DIM // 2,) and rope.inv_freq.device.type == device
        assert rope.attention_factor == pytest.approx(0.1 * math.log(128 / TRAIN_LEN) + 1)


def test_none_strategy_gives_integer_positions():
    rope = make_sampler(strategy="none").training(step=3, seq_len=10, first_sample=0, batch_size=1)
    assert torch.equal(rope.positions, torch.arange(10, dtype=torch.float32))
    assert rope.layer_positions is None and rope.inv_freq is None and rope.attention_factor == 1.0


def test_posaug_positions_have_constant_spacing_within_a_step():
    sampler = make_sampler(strategy="posaug")
    rope = sampler.training(step=7, seq_len=256, first_sample=0, batch_size=1)
    alpha = sampler.sample_alpha(7)
    gaps = rope.positions.diff()
    assert rope.positions[0] == 0
    # Equal up to float32 rounding of alpha * i (one ulp of the largest position per endpoint).
    ulp = torch.finfo(torch.float32).eps * rope.positions.max().item()
    torch.testing.assert_close(gaps, torch.full_like(gaps, alpha), rtol=0, atol=2 * ulp)
    torch.testing.assert_close(rope.positions, torch.arange(256, dtype=torch.float64).mul(alpha).float())


def test_posaug_all_layers_mode_shares_one_position_row():
    rope = make_sampler(strategy="posaug").training(step=7, seq_len=16, first_sample=0, batch_size=1)
    assert rope.layer_positions is None
    assert rope.for_layer(1) is rope.positions and rope.for_layer(NUM_LAYERS) is rope.positions


def test_posaug_bottom_mode_scales_only_the_first_k_layers():
    sampler = make_sampler(strategy="posaug", layer_mode="bottom", layer_count=2)
    rope = sampler.training(step=9, seq_len=16, first_sample=0, batch_size=1)
    scaled = torch.arange(16.0) * sampler.sample_alpha(9)
    for layer_number in range(1, NUM_LAYERS + 1):
        expected = scaled if layer_number <= 2 else torch.arange(16.0)
        torch.testing.assert_close(rope.for_layer(layer_number), expected)


def test_posaug_top_mode_scales_only_the_last_k_layers():
    sampler = make_sampler(strategy="posaug", layer_mode="top", layer_count=3)
    rope = sampler.training(step=9, seq_len=16, first_sample=0, batch_size=1)
    scaled = torch.arange(16.0) * sampler.sample_alpha(9)
    for layer_number in range(1, NUM_LAYERS + 1):
        expected = scaled if layer_number > NUM_LAYERS - 3 else torch.arange(16.0)
        torch.testing.assert_close(rope.for_layer(layer_number), expected)


def test_posaug_independent_mode_gives_every_layer_its_own_constant_spacing():
    sampler = make_sampler(strategy="posaug", layer_mode="independent")
    rope = sampler.training(step=4, seq_len=16, first_sample=0, batch_size=1)
    alphas = rope.layer_positions[:, 1]
    assert len(set(alphas.tolist())) == NUM_LAYERS
    assert torch.all((alphas >= 0.125) & (alphas <= 8.0))
    torch.testing.assert_close(rope.layer_positions, alphas[:, None] * torch.arange(16.0))


def test_posaug_evaluation_uses_alpha_one():
    rope = make_sampler(strategy="posaug", layer_mode="independent").evaluation(seq_len=100)
    assert torch.equal(rope.positions, torch.arange(100, dtype=torch.float32))


def test_random_base_keeps_integer_positions_and_draws_a_base_within_the_factors():
    sampler = make_sampler(strategy="random_base")
    for step in range(20):
        rope = sampler.training(step=step, seq_len=8, first_sample=0, batch_size=1)
        base = sampler.sample_base(step)
        assert 10000.0 / 8 <= base <= 10000.0 * 8
        assert torch.equal(rope.positions, torch.arange(8, dtype=torch.float32))
        torch.testing.assert_close(rope.inv_freq, rope_inv_freq(ROTARY_DIM, base))
        assert sampler.stats(rope)["rotary_base"] == pytest.approx(base, rel=1e-4)


def test_posaug_per_sample_gives_each_sequence_its_own_constant_spacing():
    sampler = make_sampler(strategy="posaug", granularity="per_sample")
    rope = sampler.training(step=7, seq_len=16, first_sample=3, batch_size=4)
    alphas = rope.positions[:, 1]
    assert len(set(alphas.tolist())) == 4
    assert torch.all((alphas >= 0.125) & (alphas <= 8.0))
    torch.testing.assert_close(rope.positions, alphas[:, None] * torch.arange(16.0))
    stats = sampler.stats(rope)
    assert (stats["alpha_min"], stats["alpha_max"]) == pytest.approx((alphas.min().item(), alphas.max().item()))


def test_posaug_per_sample_bottom_mode_scales_the_first_k_layers_of_every_sequence():
    sampler = make_sampler(strategy="posaug", layer_mode="bottom", layer_count=2, granularity="per_sample")
    rope = sampler.training(step=9, seq_len=16, first_sample=0, batch_size=3)
    alphas = sampler.sample_alphas(9, range(3))
    for layer_number in range(1, NUM_LAYERS + 1):
        expected = alphas[:, None] * torch.arange(16.0) if layer_number <= 2 else torch.arange(16.0).expand(3, 16)
        torch.testing.assert_close(rope.for_layer(layer_number), expected)


def test_posaug_per_sample_independent_mode_draws_per_layer_and_sequence():
    sampler = make_sampler(strategy="posaug", layer_mode="independent", granularity="per_sample")
    rope = sampler.training(step=4, seq_len=16, first_sample=0, batch_size=3)
    alphas = rope.layer_positions[..., 1]
    assert alphas.shape == (NUM_LAYERS, 3) and alphas.unique().numel() == NUM_LAYERS * 3
    torch.testing.assert_close(rope.layer_positions, alphas[..., None] * torch.arange(16.0))


def test_random_base_per_sample_gives_each_sequence_the_inverse_frequencies_of_its_own_base():
    sampler = make_sampler(strategy="random_base", granularity="per_sample")
    rope = sampler.training(step=2, seq_len=8, first_sample=0, batch_size=5)
    bases = rope.inv_freq[:, 1].double() ** (-ROTARY_DIM / 2)
    assert bases.unique().numel() == 5
    assert torch.all((bases >= 10000.0 / 8 * (1 - 1e-5)) & (bases <= 10000.0 * 8 * (1 + 1e-5)))
    for row, base in zip(rope.inv_freq, bases.tolist()):
        torch.testing.assert_close(row, rope_inv_freq(ROTARY_DIM, base))
    assert sampler.stats(rope)["rotary_base"] == pytest.approx(bases.mean().item(), rel=1e-4)


def test_random_base_evaluation_uses_the_model_base():
    rope = make_sampler(strategy="random_base").evaluation(seq_len=8)
    assert rope.inv_freq is None


@pytest.mark.parametrize("granularity", ["per_step", "per_sample"])
def test_rfs_training_positions_are_strictly_increasing_within_zero_and_max_position(granularity):
    sampler = make_sampler(strategy="rfs", max_position=1000, granularity=granularity)
    positions = sampler.training(step=2, seq_len=128, first_sample=0, batch_size=4).positions
    assert torch.all(positions.diff(dim=-1) > 0)
    assert positions.min() >= 0 and positions.max() < 1000


def test_rfs_per_sample_rows_differ():
    positions = make_sampler(strategy="rfs", granularity="per_sample").training(
        step=2, seq_len=64, first_sample=0, batch_size=4).positions
    assert all(not torch.equal(positions[0], positions[i]) for i in range(1, 4))


def test_rfs_evaluation_positions_are_the_midpoints_of_the_shared_range():
    sampler = make_sampler(strategy="rfs", max_position=1000)
    longer = sampler.evaluation(seq_len=4 * TRAIN_LEN).positions
    i = torch.arange(1, 4 * TRAIN_LEN + 1, dtype=torch.float64)
    torch.testing.assert_close(longer, (1000 * (2 * i - 1) / (2 * 4 * TRAIN_LEN)).float())
    # Shorter than training: the denominator stays 2 * n_train, so gaps stay at L / n_train.
    shorter = sampler.evaluation(seq_len=TRAIN_LEN // 2).positions
    assert shorter[0].item() == pytest.approx(1000 / (2 * TRAIN_LEN))
    torch.testing.assert_close(shorter.diff(), torch.full((TRAIN_LEN // 2 - 1,), 1000 / TRAIN_LEN))


@pytest.mark.parametrize("granularity", ["per_step", "per_sample"])
def test_rpe_positions_are_sorted_distinct_integers_in_range(granularity):
    sampler = make_sampler(strategy="rpe", max_position=200, granularity=granularity)
    positions = sampler.training(step=3, seq_len=64, first_sample=0, batch_size=5).positions
    assert torch.all(positions.diff(dim=-1) >= 1)  # strictly increasing integers => distinct
    assert torch.equal(positions, positions.round())
    assert positions.min() >= 0 and positions.max() <= 199


def test_rpe_with_max_position_equal_to_seq_len_is_the_identity():
    sampler = make_sampler(strategy="rpe", max_position=TRAIN_LEN)
    positions = sampler.training(step=3, seq_len=TRAIN_LEN, first_sample=0, batch_size=1).positions
    assert torch.equal(positions, torch.arange(TRAIN_LEN, dtype=torch.float32))


def test_rpe_positions_cover_the_whole_range_across_steps():
    sampler = make_sampler(strategy="rpe", max_position=100)
    seen = torch.cat([sampler.training(step=s, seq_len=TRAIN_LEN, first_sample=0, batch_size=1).positions
                      for s in range(20)])
    assert set(seen.long().tolist()) == set(range(100))


def test_rpe_evaluation_is_a_fixed_sorted_subset_of_the_range():
    sampler = make_sampler(strategy="rpe", max_position=512)
    first, second = sampler.evaluation(seq_len=256).positions, sampler.evaluation(seq_len=256).positions
    assert torch.equal(first, second)
    assert torch.all(first.diff() >= 1) and first.max() <= 511


def test_rpe_training_longer_than_max_position_is_rejected():
    sampler = make_sampler(strategy="rpe", max_position=TRAIN_LEN)
    with pytest.raises(ValueError, match="positions.max_position"):
        sampler.training(step=0, seq_len=TRAIN_LEN + 1, first_sample=0, batch_size=1)


@pytest.mark.parametrize("function", ["sqrt", "beta_2_5"])
def test_tail_skew_function_maps_zero_to_zero_and_one_to_one(function):
    values = skew(torch.tensor([0.0, 1.0], dtype=torch.float64), function)
    assert values.tolist() == [0.0, 1.0]


def test_beta_2_5_skew_is_the_beta_cdf():
    x = torch.linspace(0, 1, 101, dtype=torch.float64)
    expected = torch.from_numpy(scipy.stats.beta(2, 5).cdf(x.numpy()))
    torch.testing.assert_close(skew(x, "beta_2_5"), expected, rtol=0, atol=1e-12)


def test_warp_rows_are_unchanged_head_scaled_or_tail_skewed():
    sampler = make_sampler(strategy="warp", p_head=0.3, p_tail=0.3, tail_function="beta_2_5")
    seq_len = 20
    positions = sampler.training(step=1, seq_len=seq_len, first_sample=0, batch_size=400).positions
    j = torch.arange(seq_len, dtype=torch.float32)
    tail = seq_len * skew(j / seq_len, "beta_2_5")
    kinds = {"plain": 0, "head": 0, "tail": 0}
    for row in positions:
        if torch.equal(row, j):
            kinds["plain"] += 1
        elif torch.allclose(row, tail):
            kinds["tail"] += 1
        else:
            alpha = row[1].item()
            assert min(abs(alpha - a) for a in (0.4, 0.5, 0.6, 0.7, 0.8)) < 1e-6
            torch.testing.assert_close(row, j * alpha)
            kinds["head"] += 1
    # 400 rows at 30 / 30 / 40 %: each count is within ~4 standard deviations.
    assert 80 <= kinds["head"] <= 160 and 80 <= kinds["tail"] <= 160 and 120 <= kinds["plain"] <= 200


def test_warp_with_fixed_head_alpha_uses_it_for_every_head_row():
    sampler = make_sampler(strategy="warp", p_head=1.0, p_tail=0.0, head_alpha_fixed=1 / 6)
    positions = sampler.training(step=1, seq_len=12, first_sample=0, batch_size=8).positions
    torch.testing.assert_close(positions, (torch.arange(12.0) / 6).expand(8, 12))


def test_warp_tail_positions_start_at_zero_and_end_below_the_sequence_length():
    sampler = make_sampler(strategy="warp", p_head=0.0, p_tail=1.0, tail_function="sqrt")
    positions = sampler.training(step=1, seq_len=100, first_sample=0, batch_size=2).positions
    expected = 100 * torch.sqrt(torch.arange(100.0) / 100)
    torch.testing.assert_close(positions, expected.expand(2, 100))
    assert torch.all(positions.diff(dim=-1) > 0)


def test_warp_per_step_warps_the_whole_batch_the_same_way():
    sampler = make_sampler(strategy="warp", p_head=0.5, p_tail=0.5, granularity="per_step")
    kinds = set()
    for step in range(40):
        row = sampler.training(step=step, seq_len=20, first_sample=0, batch_size=4).positions
        assert row.shape == (20,)
        kinds.add("tail" if torch.allclose(row, 20 * skew(torch.arange(20.0) / 20, "sqrt")) else "head")
    assert kinds == {"head", "tail"}


def test_warp_evaluation_interpolates_positions_by_train_over_eval_length():
    sampler = make_sampler(strategy="warp")
    longer = sampler.evaluation(seq_len=4 * TRAIN_LEN).positions
    torch.testing.assert_close(longer, torch.arange(4 * TRAIN_LEN) * 0.25)
    shorter = sampler.evaluation(seq_len=TRAIN_LEN // 2).positions
    assert torch.equal(shorter, torch.arange(TRAIN_LEN // 2, dtype=torch.float32))


def test_stats_report_alpha_and_gaps_for_posaug():
    sampler = make_sampler(strategy="posaug")
    rope = sampler.training(step=11, seq_len=50, first_sample=0, batch_size=1)
    alpha = sampler.sample_alpha(11)
    stats = sampler.stats(rope)
    assert stats["alpha"] == pytest.approx(alpha, rel=1e-6)
    assert stats["min_gap"] == pytest.approx(alpha, rel=1e-5)
    assert stats["mean_gap"] == pytest.approx(alpha, rel=1e-5)
    assert stats["max_position"] == pytest.approx(49 * alpha, rel=1e-6)


def test_stats_report_the_per_layer_alpha_spread_in_independent_mode():
    sampler = make_sampler(strategy="posaug", layer_mode="independent")
    rope = sampler.training(step=11, seq_len=50, first_sample=0, batch_size=1)
    stats = sampler.stats(rope)
    alphas = rope.layer_positions[:, 1]
    assert stats["alpha_min"] == pytest.approx(alphas.min().item())
    assert stats["alpha_max"] == pytest.approx(alphas.max().item())
    assert stats["alpha"] == pytest.approx(alphas.mean().item(), rel=1e-6)


def test_stats_of_rfs_have_no_alpha_but_report_gaps():
    sampler = make_sampler(strategy="rfs", granularity="per_step")
    rope = sampler.training(step=0, seq_len=64, first_sample=0, batch_size=1)
    stats = sampler.stats(rope)
    assert "alpha" not in stats
    assert stats["min_gap"] == pytest.approx(rope.positions.diff().min().item())
    assert stats["max_position"] == pytest.approx(rope.positions.max().item())


def test_training_does_not_touch_the_default_rng():
    torch.manual_seed(0)
    before = torch.get_rng_state()
    for fields, _ in STRATEGY_CASES.values():
        make_sampler(**fields).training(step=1, seq_len=32, first_sample=0, batch_size=2)
    assert torch.equal(torch.get_rng_state(), before)
