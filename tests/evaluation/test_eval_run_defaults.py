"""`eval run`'s defaults at a small window: G(C)'s window w/4 (a warning when given >= w), the per-position plot
beside the record, a note when one model's result cannot say anything, and `eval report` pairing each run with
the baseline of its size and seed (penalty, ΔG, paired cliff reduction)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))

from conftest import REPO  # noqa: E402
from hf_save_checkpoint import tiny_config, train_and_save  # noqa: E402
from pretrain.evaluation import report  # noqa: E402
from pretrain.evaluation.caveats import EVIDENCE, EVIDENCE_SEQUENCES, caveats  # noqa: E402
from pretrain.evaluation.cli import eval_cli  # noqa: E402


@pytest.fixture(scope="module")
def checkpoint(megatron_world, tmp_path_factory):
    """A tiny PosAug model (w = 32) after 2 steps: far too little training to show anything."""
    return train_and_save(tiny_config(str(tmp_path_factory.mktemp("eval_defaults") / "run"), groups=2, untied=False))


@pytest.fixture(scope="module")
def evaluated(checkpoint, tiny_shards, tmp_path_factory):
    out = tmp_path_factory.mktemp("records")
    import contextlib
    import io

    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert eval_cli(["run", checkpoint, "--data", tiny_shards, "--lengths", "128", "--num-spans", "4",
                         "--context-gain", "64", "--output", str(out)]) == 0
    return json.loads((out / "hf.json").read_text()), out, stdout.getvalue()


@pytest.mark.slow  # a real eval / build (seconds quiet, a minute loaded)
def test_the_gain_window_defaults_to_a_quarter_of_a_window_below_2048(evaluated):
    record, _, _ = evaluated
    assert record["context_gain"]["window"] == 8


@pytest.mark.slow  # a real eval / build (seconds quiet, a minute loaded)
def test_a_per_position_loss_plot_is_written_beside_the_record(evaluated):
    _, out, stdout = evaluated
    assert (out / "hf.png").stat().st_size > 1000 and "wrote " in stdout and "and hf.png" in stdout


@pytest.mark.slow  # a real eval / build (seconds quiet, a minute loaded)
def test_a_result_after_too_little_training_says_it_cannot_tell_with_its_evidence(evaluated):
    _, _, stdout = evaluated
    notes = [line for line in stdout.splitlines() if line.startswith("note: L=128")]
    assert any(f"{EVIDENCE_SEQUENCES:,} sequences ({EVIDENCE})" in line for line in notes), stdout


@pytest.mark.slow  # a real eval / build (seconds quiet, a minute loaded)
def test_a_record_names_the_runs_size_and_method_for_eval_report(evaluated):
    record, _, _ = evaluated
    assert (record["size"], record["method"]) == ("tiny", "posaug")
    assert len(record["lengths"]["128"]["per_span"]["ood"]) == 4


@pytest.mark.slow  # a real eval / build (seconds quiet, a minute loaded)
def test_a_gain_window_not_below_the_training_window_is_warned_about(checkpoint, tiny_shards, tmp_path, capsys):
    assert eval_cli(["run", checkpoint, "--data", tiny_shards, "--num-spans", "2", "--context-gain", "64",
                     "--gain-window", "32", "--output", str(tmp_path)]) == 0
    assert "warning: --gain-window 32 is not below the training window 32" in capsys.readouterr().err


@pytest.mark.slow  # a real `eval run` process
def test_a_bare_shard_prefix_is_evaluated_with_a_note_that_its_tokenizer_could_not_be_checked(checkpoint, tiny_shards,
                                                                                             tmp_path):
    from data_prep.manifest import load_manifest

    bare = load_manifest(tiny_shards).valid_prefix  # the build's validation .bin/.idx, without its manifest
    proc = subprocess.run([sys.executable, "-m", "pretrain", "eval", "run", checkpoint, "--data", bare, "--lengths",
                           "64", "--num-spans", "2", "--output", str(tmp_path)], cwd=REPO, capture_output=True,
                          text=True, env=dict(os.environ, PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES=""), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    notes = [line for line in proc.stderr.splitlines() if "could not be checked" in line]
    assert len(notes) == 1 and notes[0].startswith(f"note: {bare} is a bare .bin/.idx prefix"), proc.stderr[-3000:]
    assert "tokenizer could not be checked against the run's" in notes[0]


def test_too_few_spans_to_tell_zero_from_a_baseline_cliff_is_said():
    record = {"lengths": {"512": {"cliff": {"cliff": 0.05, "se": 0.2}, "per_span": {"ood": [0.0] * 3}}}}
    [line] = caveats(record)
    assert line.startswith("L=512: cliff +0.050 ± 0.200 SE over 3 spans holds both 0 and the 0.336 nats")


def test_a_well_measured_cliff_after_enough_training_gets_no_note():
    record = {"run_info": {"consumed_samples": 2 * EVIDENCE_SEQUENCES},
              "lengths": {"512": {"cliff": {"cliff": 0.01, "se": 0.01}, "per_span": {"ood": [0.0] * 400}}}}
    assert caveats(record) == []


def _record(method, seed, in_dist, ood):
    return {"run": f"10m_{method}_s{seed}", "size": "10m", "method": method, "seed": seed, "data": "d",
            "train_window": 64, "parameters": 1, "context_gain": {"method": "exact", "window": 16,
                                                                  "values": {"128": ood[0] - in_dist[0]}},
            "lengths": {"512": {"loss": 1.0, "cliff": {"in_dist": sum(in_dist) / 2, "ood": sum(ood) / 2,
                                                       "cliff": (sum(ood) - sum(in_dist)) / 2},
                                "per_span": {"in_dist": in_dist, "ood": ood}}}}


def test_eval_report_pairs_each_run_with_the_baseline_of_its_size_and_seed():
    records = [_record("baseline", 42, [4.0, 4.2], [4.5, 4.9]), _record("posaug", 42, [4.1, 4.3], [4.1, 4.4]),
               _record("baseline", 137, [4.0, 4.0], [5.0, 5.0]), _record("posaug", 137, [4.0, 4.0], [4.0, 4.2])]
    rows = report.aggregate(records, baseline="baseline")
    posaug = next(row for row in rows if row["method"] == "posaug")
    # seed 42: baseline cliffs (0.5, 0.7) - posaug's (0.0, 0.1) = 0.55; seed 137: (1.0, 1.0) - (0.0, 0.2) = 0.9
    assert posaug["metrics"]["reduction@512"][0] == pytest.approx((0.55 + 0.9) / 2)
    assert posaug["metrics"]["penalty@512"][0] == pytest.approx((4.2 - 4.1) / 4.1 / 2)  # seed 137's is 0
    table = report.size_table(rows)
    # span SE sqrt(0.05² + 0.1²) / 2 from the seeds' span SEs; seed SE sd(0.55, 0.9) / sqrt(2)
    assert "paired cliff reduction vs baseline" in table and "0.725 ± 0.056 span SE ± 0.175 seed SE" in table
