"""`plan` of a DroPE run: the baseline's tokens, split into its two phases in a note."""

from pretrain.plan.estimate import build_plan
from pretrain.plan.layout import layout_for
from pretrain.plan.report import render
from pretrain.trainer.config import CONFIG_DIR, load


def _plan(name: str):
    config = load(CONFIG_DIR / f"{name}.yaml")
    return build_plan(config, layout_for(config, 1, 8, None), "h100-80gb")


def test_the_plan_of_a_drope_run_is_the_baselines_budget_split_into_pretraining_and_recalibration():
    baseline, drope = _plan("10m_baseline"), _plan("10m_drope")
    assert (drope.tokens, drope.iterations, drope.wall_seconds) == \
           (baseline.tokens, baseline.iterations, baseline.wall_seconds)
    steps, per_step = drope.iterations, drope.tokens_per_step
    recalibration = round(0.02 * steps)
    note = (f"DroPE: steps 1-{steps - recalibration:,} pretrain with RoPE ({(steps - recalibration) * per_step:,} "
            f"tokens), steps {steps - recalibration + 1:,}-{steps:,} recalibrate without RoPE "
            f"({recalibration * per_step:,} tokens, ")
    assert note in render(drope) and not any("DroPE" in n for n in baseline.notes)
    assert "pretrain with posaug RoPE" in render(_plan("10m_posaug_drope"))
