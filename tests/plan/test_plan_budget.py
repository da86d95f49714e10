"""Token budgets: the paper's Table 1 (the shipped configs) and Chinchilla's 20 tokens per parameter."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from pretrain.plan.budget import BUDGETS, CHINCHILLA_TOKENS_PER_PARAM, budget_override, budget_tokens
from pretrain.table import SIZES, TABLE1_SIZES

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("size", TABLE1_SIZES)
def test_chinchilla_is_twenty_tokens_per_table1_parameter(size):
    assert budget_tokens(size, "chinchilla") == round(CHINCHILLA_TOKENS_PER_PARAM * SIZES[size].table1_params)


@pytest.mark.parametrize("size", TABLE1_SIZES)
def test_table1_budget_is_what_the_shipped_configs_train(size):
    shipped = yaml.safe_load((REPO / "pretrain" / "configs" / f"{size}_posaug.yaml").read_text())
    assert budget_tokens(size, "table1") == shipped["schedule"]["train_tokens"]


def test_a_budget_is_one_train_tokens_override_and_none_is_the_configs_own():
    assert budget_override("113m", "chinchilla") == ["schedule.train_tokens=2266000000"]
    assert budget_override("113m", None) == []


@pytest.mark.parametrize("size, budget, message", [("113m", "kaplan", "choose from table1, chinchilla"),
                                                   ("cpu-small", "chinchilla", "is not a Table 1 size")])
def test_an_unknown_budget_or_size_is_refused_naming_the_choices(size, budget, message):
    with pytest.raises(ValueError, match=message):
        budget_tokens(size, budget)


def test_plan_budget_chinchilla_trains_twenty_tokens_per_parameter(capsys):
    from pretrain.plan.cli import main

    assert main(["10m_posaug", "--budget", "chinchilla", "--json"]) == 0
    assert '"tokens": 212000000' in capsys.readouterr().out


def test_the_launchers_budget_switch_sets_the_tokens_in_the_trainer_command():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_"))}
    env.update(BUDGET="chinchilla", PYTHONPATH=str(REPO), SYNTHETIC_DATA="1")  # without data a dry run refuses
    proc = subprocess.run(["bash", str(REPO / "slurm" / "pretrain_10m_posaug.sh"), "--dry-run"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "  budget          chinchilla\n" in proc.stdout and "schedule.train_tokens=212000000" in proc.stdout


def test_every_budget_has_a_description():
    assert set(BUDGETS) == {"table1", "chinchilla"} and all(BUDGETS.values())
