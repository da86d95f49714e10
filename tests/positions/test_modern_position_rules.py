"""p-RoPE, NoPE interleave + temperature, SSMax and PoSE: each rule against a direct reading of its paper."""

import math

import pytest
import torch

from megatron_ext.positions import (PositionConfig, attention_temperature, build_sampler, nope_layers, pose_positions,
                                    prope_inv_freq, ssmax_factor)


def test_prope_keeps_the_fastest_frequencies_and_zeroes_the_rest():
    d, base, p = 16, 10000.0, 0.75
    kept = int(p * d // 2)
    expected = [base ** (-2 * k / d) if k < kept else 0.0 for k in range(d // 2)]
    torch.testing.assert_close(prope_inv_freq(d, base, p), torch.tensor(expected, dtype=torch.float32))


def test_prope_dropped_frequencies_rotate_nothing_at_any_position():
    inv_freq = prope_inv_freq(16, 10000.0, 0.5)
    angles = torch.tensor([0.0, 3.0, 517.25, 1e6])[:, None] * inv_freq
    assert torch.equal(angles[:, 4:], torch.zeros(4, 4))
    assert (angles[1:, :4] != 0).all()


def test_prope_with_proportion_one_is_rope_and_out_of_range_is_refused():
    from megatron_ext.positions import rope_inv_freq

    assert torch.equal(prope_inv_freq(16, 500.0, 1.0), rope_inv_freq(16, 500.0))
    with pytest.raises(ValueError, match="rope_proportion"):
        prope_inv_freq(16, 500.0, 1.5)


def test_nope_layers_are_every_nth_as_in_llama4_and_megatron():
    assert nope_layers(8, 4) == [False, False, False, True] * 2
    llama4_rope = [int((i + 1) % 4 != 0) for i in range(8)]  # transformers' no_rope_layers: 1 = RoPE
    assert [not n for n in nope_layers(8, 4)] == [bool(r) for r in llama4_rope]
    assert nope_layers(6, 4) == [False, False, False, True, False, False]  # as Llama 4's, no divisibility needed
    with pytest.raises(ValueError, match="no_rope_freq"):
        nope_layers(6, 0)


def test_attention_temperature_is_one_plus_beta_log1p_floor():
    index = torch.tensor([0, 6, 7, 15, 1000])
    expected = [1 + 0.1 * math.log1p(math.floor((i + 1) / 8)) for i in index.tolist()]
    torch.testing.assert_close(attention_temperature(index, 0.1, 8.0), torch.tensor(expected, dtype=torch.float32))
    assert attention_temperature(torch.arange(7), 0.1, 8.0).eq(1.0).all()  # below F the temperature is 1


def test_ssmax_scale_at_known_key_counts():
    s = 1 / math.log(64)
    got = ssmax_factor(torch.tensor([1, 8, 64, 512]), s)
    torch.testing.assert_close(got, torch.tensor([0.0, 0.5, 1.0, 1.5]))


def _pose_reference(cut_keys, bias_uniforms, w, L):
    """PoSE's rule written token by token: chunks after the N-1 largest cut keys, sequential biases."""
    n = len(bias_uniforms)
    starts = sorted((torch.tensor(cut_keys).topk(n - 1).indices + 1).tolist())
    biases, previous = [], 0
    for u in bias_uniforms:
        previous = previous + min(math.floor(u * (L - w - previous + 1)), L - w - previous)
        biases.append(previous)
    return [j + biases[sum(j >= s for s in starts)] for j in range(w)]


def test_pose_positions_follow_the_papers_rule():
    g = torch.Generator().manual_seed(0)
    for chunks in (1, 2, 3):
        cut, bias = torch.rand(63, generator=g), torch.rand(chunks, generator=g)
        assert pose_positions(cut, bias, 64, 512).tolist() == _pose_reference(cut.tolist(), bias.tolist(), 64, 512)


def test_pose_positions_stay_in_the_target_range_increase_and_cover_it():
    sampler = build_sampler(PositionConfig(strategy="pose", max_position=256), seed=1, train_seq_len=32,
                            num_layers=2, rotary_dim=16, rotary_base=1e4, total_steps=400)
    seen = torch.zeros(256, dtype=torch.bool)
    for step in range(400):
        positions = sampler.training(step, 32, first_sample=0, batch_size=4).positions
        assert positions.shape == (4, 32)
        assert positions.min() >= 0 and positions.max() <= 255
        assert (positions.diff(dim=-1) >= 1).all()
        assert ((positions.diff(dim=-1) > 1).sum(-1) <= 1).all()  # two chunks: at most one skip
        seen[positions.long().flatten()] = True
    assert seen.all()


def test_pose_evaluates_at_plain_positions_and_refuses_a_target_below_the_window():
    sampler = build_sampler(PositionConfig(strategy="pose", max_position=256), seed=1, train_seq_len=32,
                            num_layers=2, rotary_dim=16, rotary_base=1e4, total_steps=4)
    assert torch.equal(sampler.evaluation(100).positions, torch.arange(100, dtype=torch.float32))
    with pytest.raises(ValueError, match="max_position"):
        build_sampler(PositionConfig(strategy="pose", max_position=16), seed=1, train_seq_len=32, num_layers=2,
                      rotary_dim=16, rotary_base=1e4, total_steps=4)
