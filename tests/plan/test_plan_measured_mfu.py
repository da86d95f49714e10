"""`plan`'s MFU: one FLOP count shared with the trainer, measured figures recomputed from their stored logs."""

import re
from pathlib import Path

import pytest

from megatron_ext.model_config import FLOP_CONVENTION, model_flops_utilization
from pretrain.naming import size_name
from pretrain.plan.estimate import build_plan
from pretrain.plan.hardware import GPUS
from pretrain.plan.layout import layout_for
from pretrain.plan.measured import MEASURED, measured_mfu
from pretrain.plan.report import render
from pretrain.table import SIZES
from pretrain.trainer.config import CONFIG_DIR, load

ROOT = Path(__file__).resolve().parents[2]
STEP = re.compile(r"^step (\d+)/(\d+) \|.*\| ([\d.]+)K tok/s \|.*\| MFU ([\d.]+)%")
PARAMS = re.compile(r"model: ([\d.]+)M non-embedding parameters, ([\d.]+)M total")


def _last_step(log: Path) -> tuple[float, float]:
    """Tokens/s and the trainer's printed MFU (%) of the log's last step line."""
    found = [STEP.match(line) for line in log.read_text().splitlines()]
    last = [m for m in found if m][-1]
    return float(last.group(3)) * 1e3, float(last.group(4))


@pytest.mark.parametrize("entry", MEASURED, ids=lambda e: f"{e.gpu}-{e.size}")
def test_each_measured_mfu_is_its_logs_rate_by_the_flop_convention(entry):
    tokens_per_s, _ = _last_step(ROOT / entry.log)
    model = load(ROOT / entry.config, []).model
    assert tokens_per_s == entry.tokens_per_s
    recomputed = model_flops_utilization(model.flops_per_token(), tokens_per_s, GPUS[entry.gpu].bf16_tflops)
    assert round(recomputed, 4) == entry.mfu


@pytest.mark.parametrize("entry", MEASURED, ids=lambda e: f"{e.gpu}-{e.size}")
def test_each_measured_mfu_equals_what_the_trainer_printed_in_that_log(entry):
    _, printed = _last_step(ROOT / entry.log)
    assert f"{100 * entry.mfu:.3g}" == f"{printed:.3g}"


@pytest.mark.parametrize("entry", MEASURED, ids=lambda e: f"{e.gpu}-{e.size}")
def test_each_measurement_names_the_model_its_log_trained(entry):
    model = load(ROOT / entry.config, []).model
    non_embedding, total = (float(x) for x in PARAMS.search((ROOT / entry.log).read_text()).groups())
    assert (round(model.non_embedding_parameters() / 1e6, 2), round(model.total_parameters() / 1e6, 2)) == \
        (non_embedding, total)
    assert size_name(model) == entry.size and entry.size in SIZES and entry.gpu in GPUS
    assert model.padded_vocab_size() == entry.vocab_size


def _plan(name: str, gpu: str, mfu: float | None = None, *overrides: str):
    config = load(CONFIG_DIR / f"{name}.yaml", list(overrides))
    return build_plan(config, layout_for(config, 1, 1, None), gpu, mfu=mfu)


def test_plan_of_a_measured_size_uses_the_measurement_and_names_its_file(megatron_world):
    plan = _plan("10m_baseline", "h200")
    assert plan.mfu == measured_mfu("h200", "10m", "bf16").mfu
    assert plan.mfu_source.startswith("measured: ") and "calibration_first_lease.log" in plan.mfu_source
    assert "calibration_first_lease.log" in render(plan)


def test_plan_says_how_the_measured_mfu_was_carried_to_another_vocabulary(megatron_world):
    carried = "vocabulary 4,096 measured, 50,304 planned: MFU carried over unchanged"
    assert carried in _plan("10m_baseline", "h200").mfu_source
    assert "carried over" not in _plan("10m_baseline", "h200", None, "model.vocab_size=4096").mfu_source


def test_plan_of_a_size_never_measured_uses_the_published_figure_and_says_so(megatron_world):
    plan = _plan("113m_baseline", "h200")
    assert plan.mfu == 0.47 and plan.mfu_source.startswith("published: ")


def test_a_measurement_on_one_gpu_is_not_used_for_another(megatron_world):
    assert _plan("10m_baseline", "h100-80gb").mfu_source.startswith("published: ")


def test_a_measurement_in_bf16_is_not_used_for_fp32(megatron_world):
    assert _plan("10m_baseline", "h200", None, "model.bf16=false").mfu_source.startswith("published: ")


def test_mfu_given_on_the_command_line_wins_over_a_measurement(megatron_world):
    plan = _plan("10m_baseline", "h200", 0.2)
    assert (plan.mfu, plan.mfu_source) == (0.2, "--mfu")


def test_plan_and_the_trainers_mfu_count_flops_by_the_one_convention(megatron_world, tmp_path):
    from pretrain.trainer.metrics import Metrics

    plan = _plan("10m_baseline", "h200")
    config = load(CONFIG_DIR / "10m_baseline.yaml", [f"checkpoint.save={tmp_path}", "logging.peak_tflops=989"])
    metrics = Metrics(config, total_iters=10)
    try:  # the trainer reports, at the plan's predicted rate, exactly the MFU the plan assumed
        assert metrics.mfu(plan.tokens_per_second) == pytest.approx(plan.mfu)
    finally:
        metrics.close()
    assert FLOP_CONVENTION in render(plan)


def test_causal_attention_once_removes_half_the_attention_flops():
    model = load(CONFIG_DIR / "10m_baseline.yaml", []).model
    attention = 12 * model.num_layers * model.num_attention_heads * model.kv_channels * model.seq_length
    assert model.flops_per_token() - model.flops_per_token(causal_attention_once=True) == attention / 2
