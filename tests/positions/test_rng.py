"""Randomness contract: positions depend only on (seed, step, global sample index), never on the layout."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from megatron_ext.positions import DEFAULT_GRANULARITY, PositionConfig, PositionSampler, position_generator

REPO = Path(__file__).resolve().parents[2]

CONFIGS = {
    "posaug": {"strategy": "posaug"},
    "posaug_per_sample": {"strategy": "posaug", "granularity": "per_sample"},
    "posaug_discrete_per_sample": {"strategy": "posaug", "alpha_distribution": "discrete",
                                   "granularity": "per_sample"},
    "posaug_top_per_sample": {"strategy": "posaug", "layer_mode": "top", "layer_count": 2,
                              "granularity": "per_sample"},
    "posaug_independent": {"strategy": "posaug", "layer_mode": "independent"},
    "posaug_independent_per_sample": {"strategy": "posaug", "layer_mode": "independent",
                                      "granularity": "per_sample"},
    "random_base": {"strategy": "random_base"},
    "random_base_per_sample": {"strategy": "random_base", "granularity": "per_sample"},
    "rfs": {"strategy": "rfs"},
    "rfs_per_step": {"strategy": "rfs", "granularity": "per_step"},
    "rpe": {"strategy": "rpe", "max_position": 512},
    "rpe_per_sample": {"strategy": "rpe", "max_position": 512, "granularity": "per_sample"},
    "warp": {"strategy": "warp", "p_head": 0.4, "p_tail": 0.4},
    "warp_per_step": {"strategy": "warp", "p_head": 0.4, "p_tail": 0.4, "granularity": "per_step"},
    # one stage at the full range: drawn from step 0 (the default curriculum starts at plain positions)
    "ryarn": {"strategy": "ryarn", "max_position": 512, "ryarn_stages": [1.0]},
    "ryarn_per_sample": {"strategy": "ryarn", "max_position": 512, "ryarn_stages": [1.0],
                         "granularity": "per_sample"},
}
PER_STEP_CONFIGS = sorted(n for n, f in CONFIGS.items() if PositionConfig(**f).granularity == "per_step")
PER_SAMPLE_CONFIGS = sorted(n for n, f in CONFIGS.items() if PositionConfig(**f).granularity == "per_sample")
NUM_LAYERS = 4


def make_sampler(fields: dict, seed: int = 1234) -> PositionSampler:
    return PositionSampler(PositionConfig(**fields), seed=seed, train_seq_len=64, num_layers=NUM_LAYERS,
                           rotary_dim=16, rotary_base=10000.0, total_steps=1000)


def per_sequence(name: str, step: int, first_sample: int, batch_size: int, seed: int = 1234) -> torch.Tensor:
    """What each sequence's angles depend on, one row per sequence: [batch_size, ...]."""
    rope = make_sampler(CONFIGS[name], seed).training(step, 64, first_sample=first_sample,
                                                      batch_size=batch_size)
    b = batch_size
    parts = [rope.positions.expand(b, -1)]
    if rope.layer_positions is not None:
        layers = rope.layer_positions
        parts.append((layers.movedim(1, 0) if layers.dim() == 3 else layers.expand(b, -1, -1)).flatten(1))
    if rope.inv_freq is not None:
        parts.append(rope.inv_freq.expand(b, -1))
    return torch.cat(parts, dim=1)


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("split", [(4, 4), (1,) * 8, (3, 5), (2, 1, 5)], ids=str)
def test_any_split_of_the_global_batch_draws_the_same_positions_per_sequence(name, split):
    # A split is what DP ranks x microbatches do to the global batch of one step.
    whole = per_sequence(name, step=17, first_sample=0, batch_size=8)
    starts = [sum(split[:i]) for i in range(len(split))]
    pieces = [per_sequence(name, step=17, first_sample=start, batch_size=size) for start, size in zip(starts, split)]
    assert torch.equal(torch.cat(pieces), whole)


@pytest.mark.parametrize("name", PER_STEP_CONFIGS)
def test_per_step_granularity_shares_one_draw_across_the_global_batch(name):
    rows = torch.cat([per_sequence(name, step=5, first_sample=i, batch_size=1) for i in range(0, 64, 7)])
    assert torch.equal(rows, rows[:1].expand_as(rows))


@pytest.mark.parametrize("name", PER_SAMPLE_CONFIGS)
def test_per_sample_granularity_varies_across_the_sequences_of_a_step(name):
    # Not necessarily all distinct: discrete alphas and unwarped rows repeat by design.
    rows = per_sequence(name, step=5, first_sample=0, batch_size=8)
    assert rows.unique(dim=0).shape[0] > 1


@pytest.mark.parametrize("name", PER_SAMPLE_CONFIGS)
def test_a_sequence_gets_other_positions_at_another_step(name):
    assert not torch.equal(per_sequence(name, step=5, first_sample=3, batch_size=1),
                           per_sequence(name, step=6, first_sample=3, batch_size=1))


def several_steps(name: str, steps: range, seed: int = 1234) -> torch.Tensor:
    # Several steps: one warp draw may be the (deterministic) tail or plain row by chance.
    return torch.cat([per_sequence(name, step, 0, 2, seed=seed) for step in steps])


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_different_steps_give_different_positions(name):
    assert not torch.equal(several_steps(name, range(0, 8)), several_steps(name, range(8, 16)))


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_different_seeds_give_different_positions(name):
    assert not torch.equal(several_steps(name, range(8), seed=1), several_steps(name, range(8), seed=2))


@pytest.mark.parametrize("strategy, granularity", sorted(DEFAULT_GRANULARITY.items()))
def test_each_strategy_defaults_to_its_papers_granularity(strategy, granularity):
    assert PositionConfig(strategy=strategy).granularity == granularity


def test_paper_defaults_are_posaug_rpe_random_base_ryarn_per_step_and_rfs_warp_pose_per_sample():
    assert DEFAULT_GRANULARITY == {"none": "per_step", "posaug": "per_step", "random_base": "per_step",
                                   "rpe": "per_step", "rfs": "per_sample", "warp": "per_sample",
                                   "pose": "per_sample",  # PoSE: skip offsets drawn per training example
                                   "ryarn": "per_step",  # Randomized YaRN: positions assigned per batch
                                   "drope": "per_step"}  # DroPE: plain RoPE (or PosAug's per-step alpha) first


# Run in a fresh interpreter with a different default seed, as a separate rank would.
_CHILD = """
import sys, torch
sys.path.insert(0, {tests!r})
torch.manual_seed(int(sys.argv[2]))
from test_rng import CONFIGS, per_sequence
torch.save({{name: per_sequence(name, step=17, first_sample=3, batch_size=2) for name in CONFIGS}}, sys.argv[1])
"""


def test_same_seed_step_and_samples_give_identical_positions_in_separate_processes(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    code = _CHILD.format(tests=str(Path(__file__).parent))
    paths = [tmp_path / f"rank{rank}.pt" for rank in range(2)]
    # Both "ranks" run concurrently, each with a different default-RNG seed.
    children = [subprocess.Popen([sys.executable, "-c", code, str(path), str(default_seed)], cwd=REPO, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                for path, default_seed in zip(paths, (1, 99))]
    for child in children:
        _, stderr = child.communicate(timeout=120)
        assert child.returncode == 0, stderr.decode()[-2000:]
    outputs = [torch.load(path) for path in paths]
    in_process = {name: per_sequence(name, step=17, first_sample=3, batch_size=2) for name in CONFIGS}
    for name in CONFIGS:
        assert torch.equal(outputs[0][name], outputs[1][name]), name
        assert torch.equal(outputs[0][name], in_process[name]), name


def test_positions_do_not_depend_on_the_default_rng_state():
    torch.manual_seed(0)
    first = {name: per_sequence(name, 3, 1, 2) for name in CONFIGS}
    torch.manual_seed(12345)
    torch.rand(100)
    second = {name: per_sequence(name, 3, 1, 2) for name in CONFIGS}
    assert all(torch.equal(first[name], second[name]) for name in CONFIGS)


def test_position_generator_is_a_pure_function_of_its_arguments():
    a = torch.rand(8, generator=position_generator(7, 100, 2, "cpu", stream=1))
    b = torch.rand(8, generator=position_generator(7, 100, 2, "cpu", stream=1))
    assert torch.equal(a, b)


@pytest.mark.parametrize("changed", [(8, 100, 2, 1), (7, 101, 2, 1), (7, 100, 3, 1), (7, 100, -1, 1), (7, 100, 2, 0)])
def test_position_generator_changes_stream_when_any_argument_changes(changed):
    reference = torch.rand(8, generator=position_generator(7, 100, 2, "cpu", stream=1))
    seed, iteration, sample, stream = changed
    other = torch.rand(8, generator=position_generator(seed, iteration, sample, "cpu", stream=stream))
    assert not torch.equal(reference, other)


def test_position_generator_lives_on_the_requested_device():
    generator = position_generator(0, 0, 0, device="cpu")
    assert isinstance(generator, torch.Generator) and generator.device.type == "cpu"


def test_position_generator_rejects_non_integer_arguments():
    with pytest.raises(TypeError, match="iteration must be an int"):
        position_generator(0, 1.5, 0)
