"""Training does not depend on the parallel layout: TP=2, PP=2 (1F1B), DP=2 (± distributed optimizer) and
micro-batch size 4 x 1 vs 1 x 4 accumulation give one process's losses and parameters after 3 steps, for
every position strategy and model-option method (p-RoPE, NoPE-interleave + temperature, SSMax, their PosAug
compositions, QK-norm, sinks, sliding-window layers with PosAug on the global ones), and under TP=2, PP=2 and
DP=2 with document masking too (torchrun/gloo; one launch per layout loops over all of them, the document-masked
rows included)."""

import importlib.util

import pytest
import torch

from conftest import REPO, run_torchrun

SCRIPT = "tests/distributed/parallel_step.py"
# Absolute: strategies differ from each other by ~5e-5 in loss after 3 steps and ~2e-3 in
# parameters; layouts agree to ~5e-7 and ~1e-7 (float32 reduction order).
TOLERANCE = 1e-5


def run_layout(tmp_path_factory, nproc: int, *args: str) -> dict:
    out = tmp_path_factory.mktemp("parallel_step") / "results.pt"
    run_torchrun(SCRIPT, nproc, "--out", str(out), *args, timeout=600)
    return torch.load(out)


# The rows also run with document masking (per-document positions), in the same launches as the plain rows.
DOCUMENT_STRATEGIES = "none,posaug_independent,rfs_per_step,rpe,warp,prope,ssmax,posaug_irope,swa_posaug_global"
DOCUMENTS = ["--document-strategies", DOCUMENT_STRATEGIES]
DOCUMENT_ROWS = {f"{name}+documents" for name in DOCUMENT_STRATEGIES.split(",")}


@pytest.fixture(scope="module")
def single_process(tmp_path_factory):
    return run_layout(tmp_path_factory, 1, *DOCUMENTS)


def assert_same_training(got: dict, expected: dict) -> None:
    assert sorted(got) == sorted(expected)
    for strategy, reference in expected.items():
        run = got[strategy]
        assert len(run["losses"]) == len(reference["losses"]) == 3
        for loss, expected_loss in zip(run["losses"], reference["losses"]):
            assert abs(loss - expected_loss) <= TOLERANCE, (strategy, run["losses"], reference["losses"])
        assert sorted(run["parameters"]) == sorted(reference["parameters"]), strategy
        for name, value in reference["parameters"].items():
            torch.testing.assert_close(run["parameters"][name], value, rtol=0, atol=TOLERANCE,
                                       msg=lambda m: f"{strategy}: {name}: {m}")


def without_document_rows(results: dict) -> dict:
    """The plain rows of a launch's results."""
    return {row: result for row, result in results.items() if row not in DOCUMENT_ROWS}


@pytest.mark.slow
@pytest.mark.parametrize("nproc, layout", [(2, ["--tp", "2", *DOCUMENTS]), (2, ["--pp", "2", *DOCUMENTS]),
                                           (2, DOCUMENTS), (2, ["--distributed-optimizer"]),
                                           (1, ["--micro-batch-size", "4"])],
                         ids=["tp2", "pp2", "dp2", "dp2-distributed-optimizer", "mbs4x1-vs-mbs1x4"])
def test_layout_trains_every_strategy_like_one_process(tmp_path_factory, single_process, nproc, layout):
    got = run_layout(tmp_path_factory, nproc, *layout)
    assert_same_training(got, single_process if DOCUMENTS[0] in layout else without_document_rows(single_process))


@pytest.mark.slow
def test_document_rows_are_trained_with_document_masking(single_process):
    # A document row that ran without its masking would equal its plain row: the layouts' check would then
    # compare nothing that document masking changes.
    for row in DOCUMENT_ROWS:
        plain = single_process[row.removesuffix("+documents")]["losses"]
        assert single_process[row]["losses"] != plain, row


def test_micro_batch_size_and_accumulation_do_not_change_per_sample_training(megatron_world):
    # In-process and fast: the micro-batch part of the global sample index, without torchrun.
    from pretrain.trainer import distributed

    spec = importlib.util.spec_from_file_location("parallel_step", REPO / SCRIPT)
    parallel_step = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(parallel_step)

    def train(micro_batch_size: int) -> tuple[list[float], list[torch.Tensor]]:
        model = parallel_step.model_preset("tiny")
        sampler = parallel_step.build_sampler(
            parallel_step.PositionConfig(strategy="rfs"), seed=parallel_step.SEED,
            train_seq_len=model.seq_length, num_layers=model.num_layers, rotary_dim=model.rotary_dim,
            rotary_base=model.rotary_base, total_steps=2)
        distributed.seed_all(parallel_step.SEED)
        engine = parallel_step.Engine(model, parallel_step.ParallelConfig(),
                                      parallel_step.OptimizerSettings(lr=1e-3, min_lr=1e-3, clip_grad=0.0,
                                                                      adam_eps=1e-4, lr_decay_style="constant"),
                                      train_iters=2, per_sample_positions=True)
        losses = []
        for step in range(2):
            data = parallel_step.rank_microbatches(model, step, 0, parallel_step.GLOBAL_BATCH, micro_batch_size)
            losses.append(engine.train_step(iter(data), sampler, step, len(data), micro_batch_size,
                                            model.seq_length).loss)
        return losses, [p.detach().clone() for p in engine.model.module.parameters()]

    losses_1x4, params_1x4 = train(1)
    losses_4x1, params_4x1 = train(4)
    assert losses_1x4 == pytest.approx(losses_4x1, abs=TOLERANCE, rel=0)
    for a, b in zip(params_1x4, params_4x1):
        torch.testing.assert_close(a, b, rtol=0, atol=TOLERANCE)
