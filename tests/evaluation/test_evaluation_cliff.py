"""End to end on trained tiny models: RoPE at alpha = 1 shows a larger cliff beyond w than PosAug.

Task (deterministic, cheap, learnable by both models): a second-order Markov stream over
V = 32 symbols. Each symbol x has FANOUT = 4 fixed successors succ[x, 0..3]; the next token is
succ[current, sel[previous]] (sel a fixed random map to 0..3), with probability 1 - NOISE, else
a uniformly random successor. Without context a model can reach at best ln 4 = 1.39 nats (the
current token narrows the next one to 4); with the previous token (one attention hop to the
nearest key) it reaches ~0.2 nats. Chance is ln 32 = 3.47.

Why this task: the previous token is the nearest key under any position scale, so the PosAug
model (alpha ~ U[1, 4], one alpha per step) learns it too; a task that needs a precise offset
(a repeated 8-token pattern, or "the token two back") is ambiguous under rescaled positions and
PosAug stays near chance for hundreds of steps, which made the old flat PosAug curve
uninformative. A first-order chain is not enough either: it needs no attention, so the alpha = 1
model shows no cliff (measured: 0.007 nats).

Two one-layer tiny models (w = 32) are trained 500 steps in-process with the real Engine on
the same batches, saved as Megatron checkpoints and evaluated through `load_scorer` (one through
each backend) on 32 spans of L = 128 = 4w. Training positions for PosAug reach 4 (w - 1), so
its evaluation distances stay inside what it saw; the alpha = 1 model sees distances up to
w - 1 only and its attention is disturbed by the unseen far keys.
"""

import math

import pytest
import torch

from megatron_ext.model import ParallelConfig
from megatron_ext.positions import PositionConfig, build_sampler
from pretrain.trainer import checkpoint
from pretrain.trainer import config as config_module
from pretrain.trainer.config import OptimizerSettings
from pretrain.trainer.engine import Engine
from pretrain.evaluation import cliff, eval_spans, load_scorer, per_position_loss

W, LAYERS, STEPS, MICRO_BATCH, L_EVAL, NUM_SPANS = 32, 1, 500, 8, 128, 32
VOCAB, FANOUT, NOISE = 32, 4, 0.05
CHANCE = math.log(VOCAB)
NO_CONTEXT = math.log(FANOUT)  # best loss from the current token alone


class SecondOrderChain:
    """The task's fixed tables (seeded) and a deterministic stream sampler."""

    def __init__(self, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.successors = torch.stack([torch.randperm(VOCAB, generator=generator)[:FANOUT] for _ in range(VOCAB)])
        self.selector = torch.randint(0, FANOUT, (VOCAB,), generator=generator)

    def sample(self, generator: torch.Generator, batch: int, length: int) -> torch.Tensor:
        """[batch, length] token rows."""
        rows = torch.empty(batch, length, dtype=torch.long)
        rows[:, :2] = torch.randint(0, VOCAB, (batch, 2), generator=generator)
        for t in range(2, length):
            choice = self.selector[rows[:, t - 2]]
            noisy = torch.rand(batch, generator=generator) < NOISE
            choice = torch.where(noisy, torch.randint(0, FANOUT, (batch,), generator=generator), choice)
            rows[:, t] = self.successors[rows[:, t - 1], choice]
        return rows


def train_and_save(run_dir, chain: SecondOrderChain, strategy: str, **position_kwargs) -> None:
    """Train a one-layer tiny model STEPS steps on the chain and save a Megatron checkpoint."""
    from pretrain.trainer import distributed

    distributed.seed_all(7)
    positions = PositionConfig(strategy=strategy, **position_kwargs)
    train_config = config_module.from_dict({
        "name": strategy, "seed": 7, "preset": "tiny", "model": {"seq_length": W, "num_layers": LAYERS},
        "positions": {k: getattr(positions, k) for k in ("strategy", *position_kwargs)},
        "data": {"synthetic": True}, "schedule": {"micro_batch_size": MICRO_BATCH,
                                                  "global_batch_size": MICRO_BATCH, "train_iters": STEPS}})
    optim = OptimizerSettings(lr=1e-2, min_lr=1e-3, lr_warmup_iters=10)
    engine = Engine(train_config.model, ParallelConfig(), optim, STEPS)
    sampler = build_sampler(positions, seed=7, train_seq_len=W, num_layers=LAYERS,
                            rotary_dim=train_config.model.rotary_dim,
                            rotary_base=train_config.model.rotary_base, total_steps=STEPS)
    generator = torch.Generator().manual_seed(3)
    for step in range(STEPS):
        rows = chain.sample(generator, MICRO_BATCH, W + 1)
        batch = {"tokens": rows[:, :-1], "labels": rows[:, 1:], "loss_mask": torch.ones(MICRO_BATCH, W)}
        engine.train_step(iter([batch]), sampler, step, 1, MICRO_BATCH, W)
    checkpoint.save(run_dir, STEPS, engine, {"config": config_module.to_dict(train_config)}, keep_last=1)


@pytest.fixture(scope="module")
def cliffs(megatron_world, tmp_path_factory):
    # One thread: a model this small runs several times faster than with two on a busy machine.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        root = tmp_path_factory.mktemp("cliff_runs")
        chain = SecondOrderChain()
        train_and_save(root / "baseline", chain, "none")
        train_and_save(root / "posaug", chain, "posaug", alpha_min=1.0, alpha_max=4.0)
        stream = chain.sample(torch.Generator().manual_seed(11), 1, NUM_SPANS * L_EVAL)[0]
        spans = eval_spans(stream, NUM_SPANS, L_EVAL)
        out = {}
        for name, backend in (("baseline", "hf"), ("posaug", "megatron")):
            scorer = load_scorer(root / name, backend=backend)
            assert scorer.train_window == W
            out[name] = cliff(per_position_loss(scorer, spans), W)  # in-window targets t in [w/2, w]
    finally:
        torch.set_num_threads(threads)
    return out


def test_both_models_learn_the_task_inside_the_window(cliffs):
    for name in ("baseline", "posaug"):
        in_dist = cliffs[name]["in_dist"]
        assert in_dist < 0.5 * CHANCE, (name, in_dist)
        # Below the best context-free loss: the model reads the previous token through attention.
        assert in_dist < 0.5 * NO_CONTEXT, (name, in_dist)


def test_alpha_one_model_has_a_larger_cliff_than_posaug(cliffs):
    baseline, posaug = cliffs["baseline"]["cliff"], cliffs["posaug"]["cliff"]
    assert baseline > 0.5, cliffs
    assert baseline > posaug + 0.4, cliffs
    assert baseline > 4 * posaug, cliffs


def test_posaug_loss_stays_near_its_in_window_level_beyond_the_window(cliffs):
    assert abs(cliffs["posaug"]["cliff"]) < 0.15, cliffs["posaug"]
