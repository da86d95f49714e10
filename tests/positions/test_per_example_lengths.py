"""Per-example lengths: rfs / rpe / warp draw for each right-padded sequence's own length. Runtime: ~2 s."""

import pytest
import torch

from megatron_ext.positions import PositionConfig, PositionSampler
from megatron_ext.positions.rng import STREAM_POSITIONS, position_generator
from megatron_ext.positions.strategies import skew

SEED, STEP, WINDOW, L = 1234, 5, 32, 200

PER_EXAMPLE = {
    "rfs": {"strategy": "rfs", "max_position": L},
    "rpe": {"strategy": "rpe", "max_position": L},
    "warp": {"strategy": "warp", "p_head": 0.3, "p_tail": 0.4, "tail_function": "beta_2_5"},
}


def make_sampler(granularity: str = "per_sample", **fields) -> PositionSampler:
    return PositionSampler(PositionConfig(granularity=granularity, **fields), seed=SEED, train_seq_len=WINDOW,
                           num_layers=2, rotary_dim=16, rotary_base=10000.0, total_steps=100)


def draw(sampler: PositionSampler, lengths=None, *, first_sample: int = 0, batch_size: int | None = None,
         seq_len: int = WINDOW, step: int = STEP) -> torch.Tensor:
    if batch_size is None:
        batch_size = len(lengths)
    tensor = None if lengths is None else torch.tensor(lengths)
    return sampler.training(step, seq_len, first_sample=first_sample, batch_size=batch_size,
                            lengths=tensor).positions


def sample_uniforms(sample: int, n: int) -> torch.Tensor:
    """The U[0, 1) draws of global sample `sample` at step STEP (the sampler's keyed stream)."""
    return torch.rand(n, generator=position_generator(SEED, STEP, sample, "cpu", STREAM_POSITIONS))


def test_rfs_row_of_length_n_is_its_first_n_draws_sorted_and_scaled_then_padding_at_max_position():
    lengths = [5, 32, 1, 17]
    positions = draw(make_sampler(**PER_EXAMPLE["rfs"]), lengths)
    for b, n in enumerate(lengths):
        expected = sample_uniforms(b, WINDOW)[:n].sort().values * L
        assert torch.equal(positions[b, :n], expected)
        assert torch.all(positions[b, :n] >= 0) and torch.all(positions[b, :n] < L)
        assert torch.all(positions[b, n:] == L)  # padding: finite, after every real position


def test_rfs_row_does_not_depend_on_the_other_rows_lengths():
    sampler = make_sampler(**PER_EXAMPLE["rfs"])
    one, other = draw(sampler, [6, 3, 32, 9]), draw(sampler, [6, 30, 1, 2])
    assert torch.equal(one[0], other[0])


def test_rfs_first_position_of_a_length_one_row_is_uniform_over_the_whole_range():
    # The old rule (a prefix of the window's sorted draws) gives the minimum of 32 draws, mean L / 33.
    rows = 4000
    first = draw(make_sampler(**PER_EXAMPLE["rfs"]), [1] * rows)[:, 0].double()
    standard_error = (L / 12 ** 0.5) / rows ** 0.5
    assert abs(first.mean().item() - L / 2) < 5 * standard_error


def test_rpe_row_of_length_n_is_n_sorted_distinct_integers_in_range_then_padding_at_max_position():
    lengths = [5, 32, 1, 17]
    positions = draw(make_sampler(**PER_EXAMPLE["rpe"]), lengths)
    for b, n in enumerate(lengths):
        real = positions[b, :n]
        assert torch.equal(real, real.round()) and torch.all(real.diff() >= 1)
        assert real.min() >= 0 and real.max() <= L - 1
        assert torch.all(positions[b, n:] == L)


def test_rpe_row_of_length_n_holds_the_indices_of_its_n_largest_keys():
    lengths = [3, 12]
    positions = draw(make_sampler(**PER_EXAMPLE["rpe"]), lengths)
    for b, n in enumerate(lengths):
        expected = sample_uniforms(b, L).topk(n).indices.sort().values.float()
        assert torch.equal(positions[b, :n], expected)


def test_rpe_first_position_of_a_length_one_row_is_uniform_over_the_whole_range():
    # The old rule gives the smallest of 32 distinct draws from 0..L-1 (mean ≈ L / 33 ≈ 6).
    rows = 4000
    first = draw(make_sampler(**PER_EXAMPLE["rpe"]), [1] * rows)[:, 0].double()
    standard_error = ((L ** 2 - 1) / 12) ** 0.5 / rows ** 0.5
    assert abs(first.mean().item() - (L - 1) / 2) < 5 * standard_error


def test_warp_tail_rows_stretch_over_their_own_length():
    lengths = [7, 32, 1, 20]
    positions = draw(make_sampler(strategy="warp", p_head=0.0, p_tail=1.0, tail_function="sqrt"), lengths)
    for b, n in enumerate(lengths):
        j = torch.arange(n, dtype=torch.float32)
        torch.testing.assert_close(positions[b, :n], n * skew(j / n, "sqrt"))
        last = torch.tensor((n - 1) / n, dtype=torch.float32)
        torch.testing.assert_close(positions[b, n - 1], n * skew(last, "sqrt"))
        assert torch.all(positions[b, n:] == n)  # padding: l · f(1)


def test_warp_head_and_plain_rows_do_not_depend_on_the_length():
    sampler = make_sampler(strategy="warp", p_head=0.5, p_tail=0.0)
    torch.testing.assert_close(draw(sampler, [3, 9, 1, 30]), draw(sampler, batch_size=4), rtol=0, atol=0)


def old_rule(name: str, batch_size: int) -> torch.Tensor:
    """The positions before per-example lengths existed, rebuilt from the keyed draws."""
    if name == "rfs":
        return torch.stack([sample_uniforms(b, WINDOW).sort().values * L for b in range(batch_size)])
    if name == "rpe":
        return torch.stack([sample_uniforms(b, L).topk(WINDOW, sorted=False).indices.sort().values.float()
                            for b in range(batch_size)])
    j = torch.arange(WINDOW, dtype=torch.float32)
    heads = torch.tensor([0.4, 0.5, 0.6, 0.7, 0.8])
    rows = []
    for b in range(batch_size):
        kind, head = sample_uniforms(b, 2)
        if kind < 0.3:
            rows.append(heads[min(int(head * 5), 4)] * j)
        elif kind < 0.7:
            rows.append(float(WINDOW) * skew(j / float(WINDOW), "beta_2_5"))
        else:
            rows.append(j)
    return torch.stack(rows)


@pytest.mark.parametrize("name", list(PER_EXAMPLE))
def test_without_lengths_positions_are_the_unchanged_window_draws(name):
    assert torch.equal(draw(make_sampler(**PER_EXAMPLE[name]), batch_size=16), old_rule(name, 16))


@pytest.mark.parametrize("name", list(PER_EXAMPLE))
def test_full_lengths_give_exactly_the_positions_without_lengths(name):
    sampler = make_sampler(**PER_EXAMPLE[name])
    assert torch.equal(draw(sampler, [WINDOW] * 16), draw(sampler, batch_size=16))


@pytest.mark.parametrize("name", list(PER_EXAMPLE))
def test_a_sequence_gets_the_same_row_in_a_batch_of_four_or_drawn_alone(name):
    sampler = make_sampler(**PER_EXAMPLE[name])
    lengths = [4, 31, 1, 12]
    batched = draw(sampler, lengths, first_sample=8)
    for k, n in enumerate(lengths):
        assert torch.equal(batched[k], draw(sampler, [n], first_sample=8 + k)[0])


@pytest.mark.parametrize("fields", [{"strategy": "rfs"}, {"strategy": "rpe", "max_position": L},
                                    {"strategy": "warp"}], ids=["rfs", "rpe", "warp"])
def test_lengths_are_ignored_at_per_step_granularity(fields):
    sampler = make_sampler(granularity="per_step", **fields)
    assert torch.equal(draw(sampler, [3, 9, 1, 30]), draw(sampler, batch_size=4))


@pytest.mark.parametrize("fields", [{"strategy": "posaug"}, {"strategy": "random_base"}, {"strategy": "none"}],
                         ids=["posaug", "random_base", "none"])
def test_lengths_are_ignored_by_strategies_whose_positions_do_not_depend_on_length(fields):
    sampler = make_sampler(**fields)
    with_lengths = sampler.training(STEP, WINDOW, first_sample=0, batch_size=3, lengths=torch.tensor([1, 2, 3]))
    without = sampler.training(STEP, WINDOW, first_sample=0, batch_size=3)
    assert torch.equal(with_lengths.positions, without.positions)
    assert (with_lengths.inv_freq is None) == (without.inv_freq is None)
    if without.inv_freq is not None:
        assert torch.equal(with_lengths.inv_freq, without.inv_freq)


@pytest.mark.parametrize("lengths", [torch.tensor([3, 4]), torch.tensor([[3], [4], [5]]), torch.tensor([3, 0, 5]),
                                     torch.tensor([3, WINDOW + 1, 5]), torch.tensor([3.0, 4.0, 5.0]), [3, 4, 5]],
                         ids=["short", "2d", "zero", "too_long", "float", "list"])
def test_bad_lengths_raise_a_value_error_naming_lengths(lengths):
    with pytest.raises(ValueError, match="^lengths must"):
        make_sampler(**PER_EXAMPLE["rfs"]).training(STEP, WINDOW, first_sample=0, batch_size=3, lengths=lengths)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ["rfs", "rpe"])
def test_full_cpu_lengths_give_exactly_the_accelerator_positions_without_lengths(name):
    sampler = make_sampler(**PER_EXAMPLE[name])
    kwargs = dict(first_sample=0, batch_size=4, device="cuda")
    full = sampler.training(STEP, WINDOW, lengths=torch.full((4,), WINDOW), **kwargs).positions
    assert full.device.type == "cuda"
    assert torch.equal(full, sampler.training(STEP, WINDOW, **kwargs).positions)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", list(PER_EXAMPLE))
def test_an_accelerator_row_of_length_n_is_the_same_in_a_batch_or_alone(name):
    sampler = make_sampler(**PER_EXAMPLE[name])
    lengths = [4, 31, 1, 12]
    batched = sampler.training(STEP, WINDOW, first_sample=0, batch_size=4, device="cuda",
                               lengths=torch.tensor(lengths)).positions
    for k, n in enumerate(lengths):
        alone = sampler.training(STEP, WINDOW, first_sample=k, batch_size=1, device="cuda",
                                 lengths=torch.tensor([n])).positions
        assert torch.equal(batched[k], alone[0])
