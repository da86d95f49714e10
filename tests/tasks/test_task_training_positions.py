"""Task training through the real engine draws each example's positions for its own length. Runtime: ~5 s."""

import pytest
import torch

from megatron_ext.model import ParallelConfig
from megatron_ext.positions import PositionConfig, build_sampler
from pretrain.table import model_preset
from pretrain.tasks.generators import VOCAB_SIZE
from pretrain.tasks.source import TaskSource, sequence_tokens
from pretrain.trainer.config import OptimizerSettings
from pretrain.trainer.data import batches, step_batches
from pretrain.trainer.engine import Engine

GLOBAL_BATCH, MICRO_BATCH, STEPS = 8, 4, 2
WINDOW = sequence_tokens("copy", 6)


@pytest.fixture(scope="module")
def recorded(megatron_world):
    """(sampler, source, {(step, microbatch): positions the model got}, step results) of a 2-step rfs task run."""
    from pretrain.trainer import distributed

    distributed.seed_all(3)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = model_preset("tiny", num_layers=1, seq_length=WINDOW, vocab_size=VOCAB_SIZE)
        sampler = build_sampler(PositionConfig(strategy="rfs", granularity="per_sample"), seed=3,
                                train_seq_len=WINDOW, num_layers=1, rotary_dim=model.rotary_dim,
                                rotary_base=model.rotary_base, total_steps=STEPS)
        engine = Engine(model, ParallelConfig(), OptimizerSettings(lr=1e-3), STEPS, per_sample_positions=True)
        source = TaskSource("copy", 1, 6, WINDOW, seed=3)
        seen, current = {}, {}

        def record(_module, args):
            key = (current["step"], current["microbatch"])
            current["microbatch"] += 1
            seen[key] = args[1].positions.clone()

        hook = engine.chunks[0].register_forward_pre_hook(record)
        results = []
        for step in range(STEPS):
            current.update(step=step, microbatch=0)
            results.append(engine.train_step(step_batches(source, step, GLOBAL_BATCH, 0, 1, MICRO_BATCH),
                                             sampler, step, GLOBAL_BATCH // MICRO_BATCH, MICRO_BATCH, WINDOW))
        hook.remove()
        return sampler, source, seen, results
    finally:
        torch.set_num_threads(threads)


def test_task_training_steps_update_the_model(recorded):
    *_, results = recorded
    assert all(r.update_successful and torch.isfinite(torch.tensor(r.loss)) for r in results)


def test_task_training_positions_are_each_examples_per_length_draw(recorded):
    sampler, source, seen, _ = recorded
    assert len(seen) == STEPS * GLOBAL_BATCH // MICRO_BATCH
    for (step, microbatch), positions in seen.items():
        for i in range(MICRO_BATCH):
            sample = step * GLOBAL_BATCH + microbatch * MICRO_BATCH + i
            length = len(source.example(sample).ids()) - 1
            expected = sampler.training(step, WINDOW, first_sample=microbatch * MICRO_BATCH + i, batch_size=1,
                                        lengths=torch.tensor([length])).positions[0]
            assert torch.equal(positions[i], expected)


def test_task_training_positions_differ_from_the_window_draw_for_short_examples(recorded):
    sampler, source, seen, _ = recorded
    window_draw = sampler.training(0, WINDOW, first_sample=0, batch_size=MICRO_BATCH).positions
    assert not torch.equal(seen[(0, 0)], window_draw)


def test_batches_stack_position_length_only_for_sources_that_have_it():
    from pretrain.trainer.data import SyntheticTokens

    task = next(batches(TaskSource("copy", 1, 6, WINDOW, seed=3), 0, MICRO_BATCH, 1))
    assert task["position_length"].shape == (MICRO_BATCH,) and task["position_length"].dtype == torch.long
    language = next(batches(SyntheticTokens(64, 16, seed=0, size=8), 0, MICRO_BATCH, 1))
    assert "position_length" not in language
