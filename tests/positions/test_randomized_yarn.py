"""Randomized YaRN (strategy ryarn) against the paper's definition and our YaRN numerics (pure torch)."""

import pytest
import torch

from megatron_ext.positions import PositionConfig, PositionSampler, RopeScaling, scaled_inv_freq
from megatron_ext.positions.documents import Documents
from megatron_ext.positions.randomized_yarn import inference_factor, position_range

WINDOW, RANGE, ROTARY_DIM, BASE = 64, 512, 16, 10000.0


def make_sampler(total_steps: int = 100, train_seq_len: int = WINDOW, **fields) -> PositionSampler:
    config = PositionConfig(**{"strategy": "ryarn", "max_position": RANGE, **fields})
    return PositionSampler(config, seed=7, train_seq_len=train_seq_len, num_layers=2, rotary_dim=ROTARY_DIM,
                           rotary_base=BASE, total_steps=total_steps)


def our_yarn(factor: float, window: int = WINDOW) -> tuple[torch.Tensor, float]:
    """scaling.py's YaRN (the one RoPE-scaling vocabulary) at `factor` over `window`."""
    scaling = RopeScaling(kind="yarn", factor=factor, original_max_position_embeddings=window)
    return scaled_inv_freq(ROTARY_DIM, BASE, scaling, window)


def test_the_default_curriculum_is_the_papers_8k_10k_12k_16k_16k_in_equal_shares_of_the_run():
    # The paper: 8K data, the range 8K -> 10K -> 12K -> 16K -> 16K over five epochs; here w = 8, L = 16 (in K).
    ranges = [position_range(step, 100, 8192, 16384, PositionConfig().ryarn_stages) for step in range(100)]
    assert [ranges[step] for step in (0, 20, 40, 60, 80)] == [8192, 10240, 12288, 16384, 16384]
    assert ranges == sorted(ranges) and [ranges.count(r) for r in (8192, 10240, 12288)] == [20, 20, 20]
    assert position_range(10_000, 100, 8192, 16384, PositionConfig().ryarn_stages) == 16384  # past the end: L


@pytest.mark.parametrize("step", [0, 25, 45, 70, 99])
def test_training_positions_are_sorted_distinct_integers_below_the_steps_range(step):
    sampler = make_sampler()
    positions = sampler.training(step, WINDOW, first_sample=0, batch_size=2).positions
    limit = position_range(step, 100, WINDOW, RANGE, sampler.config.ryarn_stages)
    assert positions.shape == (WINDOW,) and positions.dtype == torch.float32
    assert torch.equal(positions, positions.round()) and (positions.diff() > 0).all()
    assert positions.min() >= 0 and positions.max() <= limit - 1


def test_every_position_of_the_range_is_drawn_equally_often_as_a_uniform_subset_is():
    # Ruoss et al.: I ~ U(P_n), each of the L positions in the subset with probability n / L.
    sampler = make_sampler(ryarn_stages=[1.0])
    draws = 400
    counts = torch.zeros(RANGE)
    for step in range(draws):
        counts[sampler.training(step, WINDOW, first_sample=0, batch_size=1).positions.long()] += 1
    expected = draws * WINDOW / RANGE  # 50, binomial sd ~6.6
    assert (counts > 0).all() and (counts - expected).abs().max() < 5 * (expected * (1 - WINDOW / RANGE)) ** 0.5


def test_with_the_range_at_the_window_training_is_our_yarn_exactly():
    # Stage 0 of the curriculum: L_t = w, so the sorted w-subset of {0..w-1} is 0..w-1, rotated by our YaRN at s.
    rope = make_sampler().training(0, WINDOW, first_sample=0, batch_size=2)
    inv_freq, attention = our_yarn(RANGE / WINDOW)
    assert torch.equal(rope.positions, torch.arange(WINDOW, dtype=torch.float32))
    assert torch.equal(rope.inv_freq, inv_freq) and rope.attention_factor == attention


def test_every_training_step_uses_our_yarn_at_s_equal_to_the_range_over_the_window_or_the_set_factor():
    for fields, factor in (({}, RANGE / WINDOW), ({"ryarn_factor": 3.0}, 3.0)):
        rope = make_sampler(**fields).training(90, WINDOW, first_sample=0, batch_size=1)
        inv_freq, attention = our_yarn(factor)
        assert torch.equal(rope.inv_freq, inv_freq) and rope.attention_factor == attention


@pytest.mark.parametrize("fields, factor", [({}, RANGE / WINDOW),
                                            ({"rope_scaling": "yarn", "rope_scaling_factor": 16.0}, 16.0)])
def test_evaluation_is_plain_positions_under_the_baselines_yarn_at_inference(fields, factor):
    # The paper evaluates with standard YaRN at s (or s' >= s), no sampling: the baseline + YaRN's numerics.
    baseline = PositionSampler(PositionConfig(rope_scaling="yarn", rope_scaling_factor=factor), seed=7,
                               train_seq_len=WINDOW, num_layers=2, rotary_dim=ROTARY_DIM, rotary_base=BASE,
                               total_steps=1).evaluation(1024)
    rope = make_sampler(**fields).evaluation(1024)
    assert torch.equal(rope.positions, baseline.positions) and torch.equal(rope.inv_freq, baseline.inv_freq)
    assert rope.attention_factor == baseline.attention_factor and rope.layer_positions is None


def test_per_sample_rows_are_each_a_sorted_subset_and_differ_between_sequences():
    rope = make_sampler(granularity="per_sample", ryarn_stages=[1.0]).training(3, WINDOW, first_sample=0,
                                                                               batch_size=3)
    assert rope.positions.shape == (3, WINDOW) and (rope.positions.diff(dim=-1) > 0).all()
    assert rope.positions.unique(dim=0).shape[0] == 3 and rope.positions.max() < RANGE


def test_documents_each_get_a_sorted_subset_restarting_below_the_range():
    tokens = torch.tensor([[5, 5, 5, 0, 5, 5, 5, 5, 5, 0, 5, 5, 5, 5, 5, 5]])
    documents = Documents.from_tokens(tokens, 0)  # an EOD ends its document: [0, 4), [4, 10), [10, 16)
    rope = make_sampler(train_seq_len=16, max_position=128, ryarn_stages=[1.0]).training(
        2, 16, first_sample=0, batch_size=1, documents=documents)
    for start, stop in ((0, 4), (4, 10), (10, 16)):
        row = rope.positions[0, start:stop]
        assert (row.diff() > 0).all() and row.min() >= 0 and row.max() < 128
    assert rope.inv_freq is not None and rope.attention_factor > 1


@pytest.mark.parametrize("fields, message", [
    ({"ryarn_factor": 0.5}, "positions.ryarn_factor must be None or >= 1 (YaRN's scale) (got 0.5)"),
    ({"ryarn_stages": [0.5, 1.5]}, "positions.ryarn_stages must be all in [0, 1]"),
    ({"ryarn_stages": [0.5, 0.25]}, "positions.ryarn_stages must be non-decreasing"),
    ({"ryarn_stages": []}, "positions.ryarn_stages must be a non-empty list of numbers"),
    ({"rope_scaling": "pi"}, "positions.rope_scaling=pi would replace the YaRN that strategy ryarn trains with"),
])
def test_bad_ryarn_settings_are_refused_in_one_line_naming_the_field(fields, message):
    with pytest.raises(ValueError) as error:
        PositionConfig(strategy="ryarn", **fields)
    assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("fields, message", [
    ({"max_position": 32}, "positions.max_position must be >= the sequence length for strategy ryarn (got 32 < "
                           "seq_len 64)"),
    ({"rope_scaling": "yarn"}, "positions.rope_scaling_factor must be >= the YaRN factor s = 8"),
    ({"rope_scaling": "yarn", "rope_scaling_factor": 4.0}, "positions.rope_scaling_factor must be >= the YaRN "
                                                           "factor s = 8"),
])
def test_settings_that_contradict_the_window_are_refused_when_the_sampler_is_built(fields, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        make_sampler(**fields)


def test_an_inference_scaling_other_than_a_larger_yarn_is_refused_naming_the_flags():
    assert inference_factor(8.0, "none", None) == 8.0 and inference_factor(8.0, "yarn", 12.0) == 12.0
    with pytest.raises(ValueError, match="--rope-scaling=ntk would replace the YaRN"):
        inference_factor(8.0, "ntk", 8.0, kind_name="--rope-scaling", factor_name="--factor")
    with pytest.raises(ValueError, match=r"--factor must be >= the YaRN factor s = 8"):
        inference_factor(8.0, "yarn", 2.0, kind_name="--rope-scaling", factor_name="--factor")
