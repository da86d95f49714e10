"""End to end on trained tiny models: RoPE at alpha = 1 shows a larger cliff beyond w than PosAug.

Two tiny models (2 layers, w = 32) are trained 100 steps in-process with the real Engine on
a deterministic copy stream (a random 8-token pattern repeated, 16-symbol alphabet), saved
as Megatron checkpoints and evaluated through `load_scorer` (one through each backend) at
L = 128 = 4w. The alpha = 1 model learns to copy from 8 positions back and breaks down once
queries pass w; the PosAug model (alpha ~ U[1, 4], L_max = 4w) shows no cliff. Caveat: in
100 steps PosAug does not learn this task (a copy offset that alpha rescales every step needs
content matching, i.e. induction heads, which take far longer), so its curve is flat near
chance: the test pins the metric's behaviour and the two loading paths, not PosAug's merit.
"""

import pytest
import torch

from megatron_ext.model import ParallelConfig, preset
from megatron_ext.positions import PositionConfig, build_sampler
from pretrain import checkpoint
from pretrain import config as config_module
from pretrain.engine import Engine, OptimizerSettings
from pretrain.evaluation import cliff, eval_spans, load_scorer, per_position_loss

W, STEPS, MICRO_BATCH, PERIOD, ALPHABET, L_EVAL = 32, 100, 8, 8, 16, 128


def copy_stream(generator: torch.Generator, batch: int, length: int) -> torch.Tensor:
    """[batch, length] rows: a random PERIOD-token pattern over ALPHABET symbols, repeated."""
    pattern = torch.randint(0, ALPHABET, (batch, PERIOD), generator=generator)
    return pattern[:, torch.arange(length) % PERIOD]


def train_and_save(run_dir, strategy: str, **position_kwargs) -> None:
    """Train a tiny model STEPS steps on the copy stream and save a Megatron checkpoint."""
    from pretrain import distributed

    distributed.seed_all(7)
    positions = PositionConfig(strategy=strategy, **position_kwargs)
    train_config = config_module.from_dict({
        "name": strategy, "seed": 7, "preset": "tiny", "model": {"seq_length": W, "num_layers": 2},
        "positions": {k: getattr(positions, k) for k in ("strategy", *position_kwargs)},
        "data": {"synthetic": True}, "schedule": {"micro_batch_size": MICRO_BATCH,
                                                  "global_batch_size": MICRO_BATCH, "train_iters": STEPS}})
    optim = OptimizerSettings(lr=1e-2, min_lr=1e-3, lr_warmup_iters=10)
    engine = Engine(train_config.model, ParallelConfig(), optim, STEPS)
    sampler = build_sampler(positions, seed=7, train_seq_len=W, num_layers=2, rotary_dim=train_config.model.rotary_dim,
                            rotary_base=train_config.model.rotary_base, total_steps=STEPS)
    generator = torch.Generator().manual_seed(3)
    for step in range(STEPS):
        rows = copy_stream(generator, MICRO_BATCH, W + 1)
        batch = {"tokens": rows[:, :-1], "labels": rows[:, 1:], "loss_mask": torch.ones(MICRO_BATCH, W)}
        engine.train_step(iter([batch]), sampler, step, 1, MICRO_BATCH, W)
    checkpoint.save(run_dir, STEPS, engine, {"config": config_module.to_dict(train_config)}, keep_last=1)


@pytest.fixture(scope="module")
def cliffs(megatron_world, tmp_path_factory):
    torch.set_num_threads(2)
    root = tmp_path_factory.mktemp("cliff_runs")
    train_and_save(root / "baseline", "none")
    train_and_save(root / "posaug", "posaug", alpha_min=1.0, alpha_max=4.0)
    spans = eval_spans(copy_stream(torch.Generator().manual_seed(11), 1, 8 * L_EVAL)[0], 8, L_EVAL)
    out = {}
    for name, backend in (("baseline", "hf"), ("posaug", "megatron")):
        scorer = load_scorer(root / name, backend=backend)
        assert scorer.train_window == W
        out[name] = cliff(per_position_loss(scorer, spans), W, in_start=2 * PERIOD)
    return out


def test_alpha_one_model_has_a_larger_cliff_than_posaug(cliffs):
    baseline, posaug = cliffs["baseline"], cliffs["posaug"]
    assert baseline["in_dist"] < 2.0  # it learned the copy inside the window (chance: ln 16 = 2.77) ...
    assert baseline["cliff"] > 1.0  # ... and loses it beyond w
    assert baseline["cliff"] > posaug["cliff"] + 1.0
    assert abs(posaug["cliff"]) < 0.2
