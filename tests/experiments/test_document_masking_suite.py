"""`reproduce --suite documents`: the table's statistics from per-span records, and the CLI's refusals."""

import pytest

from pretrain.experiments import document_masking as suite
from pretrain.experiments.presets import PRESETS
from pretrain.experiments.reproduce_cli import main as reproduce_main

PRESET = PRESETS["cpu-tiny"]


def record(method: str, arm: str, seed: int, in_dist: list[float], ood: list[float]) -> dict:
    name = suite.run_name(method, arm, seed)
    mean_in, mean_ood = sum(in_dist) / len(in_dist), sum(ood) / len(ood)
    return {"run": name, "label": name.rsplit("_s", 1)[0], "method": method, "arm": arm, "seed": seed,
            "train_window": PRESET.window, "per_span": {"in_dist": in_dist, "ood": ood},
            "lengths": {str(PRESET.eval_length): {"loss": 0.0, "curve": [0.0],
                                                  "cliff": {"in_dist": mean_in, "ood": mean_ood,
                                                            "cliff": mean_ood - mean_in}}}}


def test_run_names_mark_the_document_masked_arm():
    assert suite.run_name("posaug", "plain", 42) == "posaug_s42"
    assert suite.run_name("posaug", "docmask", 42) == "posaug+docmask_s42"


def test_summary_pairs_each_arm_with_its_own_baseline_and_each_method_across_arms():
    records = []
    for seed in (42, 137):
        records += [record("baseline", "plain", seed, [3.0, 3.0], [3.5, 3.7]),        # cliff 0.6
                    record("posaug", "plain", seed, [3.1, 3.1], [3.2, 3.2]),          # cliff 0.1
                    record("baseline", "docmask", seed, [3.0, 3.0], [4.0, 4.2]),      # cliff 1.1
                    record("posaug", "docmask", seed, [3.0, 3.0], [3.3, 3.3])]        # cliff 0.3
    summary = suite.summarise(records, PRESET)
    assert summary["posaug"]["paired_reduction"][0] == pytest.approx(0.5)
    assert summary["posaug+docmask"]["paired_reduction"][0] == pytest.approx(0.8)
    assert summary["baseline+docmask"]["cliff_change"][0] == pytest.approx(0.5)  # masking grows the cliff
    assert summary["posaug+docmask"]["cliff_change"][0] == pytest.approx(0.2)
    assert summary["posaug"]["penalty"][0] == pytest.approx(0.1 / 3.0)


def test_reproduce_dispatches_the_documents_suite_and_refuses_bad_seed_counts(capsys):
    assert reproduce_main(["--suite", "documents", "--num-seeds", "0"]) == 2
    assert "--num-seeds 0: expected 1 to" in capsys.readouterr().err
