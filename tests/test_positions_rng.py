"""Determinism: positions depend only on (seed, step, microbatch), never on process or default RNG state."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from megatron_ext.positions import PositionConfig, PositionSampler, position_generator

REPO = Path(__file__).resolve().parents[1]

CONFIGS = {
    "posaug": {"strategy": "posaug"},
    "posaug_independent": {"strategy": "posaug", "layer_mode": "independent"},
    "random_base": {"strategy": "random_base"},
    "rfs": {"strategy": "rfs", "per_sample": True},
    "rpe": {"strategy": "rpe", "max_position": 512},
    "warp": {"strategy": "warp", "p_head": 0.4, "p_tail": 0.4},
}


def make_sampler(fields: dict, seed: int = 1234) -> PositionSampler:
    return PositionSampler(PositionConfig(**fields), seed=seed, train_seq_len=64, num_layers=4,
                           rotary_dim=16, rotary_base=10000.0, total_steps=1000)


def draw(name: str, step: int, microbatch: int, seed: int = 1234) -> torch.Tensor:
    """All tensors of one RopePositions, flattened into one vector for comparison."""
    rope = make_sampler(CONFIGS[name], seed).training(step=step, microbatch=microbatch, seq_len=64, batch_size=4)
    parts = [rope.positions, rope.layer_positions, rope.inv_freq]
    return torch.cat([p.flatten() for p in parts if p is not None])


# Run in a fresh interpreter with a different default seed, as a separate rank would.
_CHILD = """
import sys, torch
sys.path.insert(0, {tests!r})
torch.manual_seed(int(sys.argv[2]))
from test_positions_rng import CONFIGS, draw
torch.save({{name: draw(name, step=17, microbatch=3) for name in CONFIGS}}, sys.argv[1])
"""


def test_same_seed_step_and_microbatch_give_identical_positions_in_separate_processes(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    code = _CHILD.format(tests=str(REPO / "tests"))
    paths = [tmp_path / f"rank{rank}.pt" for rank in range(2)]
    # Both "ranks" run concurrently, each with a different default-RNG seed.
    children = [subprocess.Popen([sys.executable, "-c", code, str(path), str(default_seed)], cwd=REPO, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                for path, default_seed in zip(paths, (1, 99))]
    for child in children:
        _, stderr = child.communicate(timeout=120)
        assert child.returncode == 0, stderr.decode()[-2000:]
    outputs = [torch.load(path) for path in paths]
    in_process = {name: draw(name, step=17, microbatch=3) for name in CONFIGS}
    for name in CONFIGS:
        assert torch.equal(outputs[0][name], outputs[1][name]), name
        assert torch.equal(outputs[0][name], in_process[name]), name


@pytest.mark.parametrize("name", ["posaug", "posaug_independent", "random_base"])
def test_all_microbatches_of_one_step_share_the_per_step_draw(name):
    first = draw(name, step=5, microbatch=0)
    for microbatch in range(1, 8):
        assert torch.equal(draw(name, step=5, microbatch=microbatch), first)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_different_steps_give_different_positions(name):
    assert not torch.equal(draw(name, step=5, microbatch=0), draw(name, step=6, microbatch=0))


@pytest.mark.parametrize("name", ["rfs", "rpe", "warp"])
def test_different_microbatches_of_one_step_get_different_positions(name):
    assert not torch.equal(draw(name, step=5, microbatch=0), draw(name, step=5, microbatch=1))


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_different_seeds_give_different_positions(name):
    assert not torch.equal(draw(name, step=5, microbatch=0, seed=1), draw(name, step=5, microbatch=0, seed=2))


def test_positions_do_not_depend_on_the_default_rng_state():
    torch.manual_seed(0)
    first = {name: draw(name, step=3, microbatch=1) for name in CONFIGS}
    torch.manual_seed(12345)
    torch.rand(100)
    second = {name: draw(name, step=3, microbatch=1) for name in CONFIGS}
    assert all(torch.equal(first[name], second[name]) for name in CONFIGS)


def test_position_generator_is_a_pure_function_of_its_arguments():
    a = torch.rand(8, generator=position_generator(7, 100, 2, "cpu", stream=1))
    b = torch.rand(8, generator=position_generator(7, 100, 2, "cpu", stream=1))
    assert torch.equal(a, b)


@pytest.mark.parametrize("changed", [(8, 100, 2, 1), (7, 101, 2, 1), (7, 100, 3, 1), (7, 100, -1, 1), (7, 100, 2, 0)])
def test_position_generator_changes_stream_when_any_argument_changes(changed):
    reference = torch.rand(8, generator=position_generator(7, 100, 2, "cpu", stream=1))
    seed, iteration, microbatch, stream = changed
    other = torch.rand(8, generator=position_generator(seed, iteration, microbatch, "cpu", stream=stream))
    assert not torch.equal(reference, other)


def test_position_generator_lives_on_the_requested_device():
    generator = position_generator(0, 0, 0, device="cpu")
    assert isinstance(generator, torch.Generator) and generator.device.type == "cpu"


def test_position_generator_rejects_non_integer_arguments():
    with pytest.raises(TypeError, match="iteration must be an int"):
        position_generator(0, 1.5, 0)
