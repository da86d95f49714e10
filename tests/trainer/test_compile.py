"""model.compile: each transformer layer compiled with torch.compile trains like the eager model."""

import importlib.util

import pytest

from conftest import REPO


def _parallel_step():
    spec = importlib.util.spec_from_file_location("parallel_step", REPO / "tests/distributed/parallel_step.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PS = _parallel_step()


def losses(compile_layers: bool) -> list[float]:
    from pretrain.trainer import distributed

    model = PS.model_preset("tiny", compile=compile_layers)
    sampler = PS.build_sampler(PS.PositionConfig(strategy="posaug"), seed=PS.SEED, train_seq_len=model.seq_length,
                               num_layers=model.num_layers, rotary_dim=model.rotary_dim,
                               rotary_base=model.rotary_base, total_steps=5)
    distributed.seed_all(PS.SEED)
    engine = PS.Engine(model, PS.ParallelConfig(), PS.OptimizerSettings(lr=1e-3, min_lr=1e-3,
                                                                        lr_decay_style="constant"), train_iters=5)
    out = []
    for step in range(5):
        data = PS.rank_microbatches(model, step, 0, PS.GLOBAL_BATCH, 2)
        out.append(engine.train_step(iter(data), sampler, step, len(data), 2, model.seq_length).loss)
    return out


@pytest.mark.slow
def test_compiled_layers_train_with_the_eager_losses_over_five_steps(megatron_world):
    from torch._dynamo.utils import counters

    eager, compiled = losses(False), losses(True)
    assert counters["stats"]["unique_graphs"] >= 1  # the layers did run compiled
    # fp32 on CPU: the compiled kernels fuse and reorder reductions (Inductor), ~1e-6 relative per op
    assert compiled == pytest.approx(eager, rel=1e-5, abs=0)
