"""The cliff's in-distribution range: one rule (pretrain/evaluation/ranges.py) that every tool reads."""

import pytest

from pretrain.evaluation.ranges import cliff_in_start
from pretrain.experiments import ablation_tables, presets


@pytest.mark.parametrize("window, start", [(2048, 64), (256, 64), (128, 32), (64, 16), (32, 8), (16, 4), (2, 1)])
def test_the_range_starts_at_the_papers_64_or_a_quarter_of_a_shorter_window(window, start):
    assert cliff_in_start(window) == start


def test_every_reproduction_and_ablation_preset_measures_from_the_rules_start():
    every = {**presets.PRESETS, **{f"ablations {k}": v for k, v in ablation_tables.PRESETS.items()}}
    assert {name: p.in_dist_start for name, p in every.items()} == {
        name: cliff_in_start(p.window) for name, p in every.items()}


def test_the_cliff_without_an_in_start_uses_the_rule():
    import torch

    from pretrain.evaluation.metrics import cliff

    losses = torch.arange(1, 8 * 64, dtype=torch.float64)  # loss at target t = t
    assert cliff(losses, 64)["in_dist"] == pytest.approx(sum(range(16, 65)) / 49)


def test_eval_run_help_states_the_default_the_rule_gives():
    import subprocess
    import sys

    shown = subprocess.run([sys.executable, "-m", "pretrain", "eval", "run", "--help"], capture_output=True, text=True,
                           check=True).stdout
    assert "default: min(64, w/4)" in " ".join(shown.split())
