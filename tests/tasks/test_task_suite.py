"""`python -m pretrain reproduce --suite tasks`: end to end at cpu-tiny (1 and 2 seeds, resumable, --report-only)
and papers-protocol scaled down; presets and config checks.

Runtime: the cpu-tiny e2e tests share one output directory taken through six invocations (11 tiny trainings of 3
steps, each its own process; ~1.5 CPU-minutes, minutes of wall time on a loaded machine); every preset's configs validated in ~5 s; the
rest < 1 s.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import pretrain.tasks  # noqa: F401 (registers the task data source the trainer's config checks, as `python -m pretrain` does)
from pretrain.trainer import config as config_module

REPO = Path(__file__).resolve().parents[2]


def reproduce_tasks(out: Path, *extra: str, preset: str = "cpu-tiny") -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="")
    return subprocess.run([sys.executable, "-m", "pretrain", "reproduce", "--suite", "tasks", "--preset", preset,
                           "--output", str(out), *extra], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=1500)


@pytest.fixture(scope="module")
def tiny_suite(tmp_path_factory):
    """One output directory taken through the invocations a user makes, each run trained once for the module:
    the baseline alone; every method (1 seed); the same again (resumes, trains nothing); a second seed for the
    baseline and RFS; a --report-only report of both seeds. Returns (output dir, {step: completed process})."""
    out = tmp_path_factory.mktemp("tasks")
    # --jobs 1 evaluates in the command's own process; "every method" keeps the default (one job per core), so the
    # spawned evaluation workers are taken too.
    steps = {
        "baseline": ["--methods", "baseline", "--jobs", "1"],
        "every method": [],
        "every method again": [],
        "challenger": ["--methods", "ryarn", "--jobs", "1"],  # an opt-in row beside the stored ones: only it trains
        "two seeds": ["--num-seeds", "2", "--methods", "baseline", "rfs", "--jobs", "1"],
        "two seeds, report only": ["--num-seeds", "2", "--methods", "baseline", "rfs", "--report-only"],
    }
    done = {}
    for step, extra in steps.items():
        if step == "two seeds":  # one evaluation as written before per-example scores were stored
            cached = out / "eval" / "copy_baseline_s42.json"
            record = json.loads(cached.read_text())
            done["former evaluation"] = record
            cached.write_text(json.dumps({**record, "lengths": [
                {k: v for k, v in x.items() if k != "example_tokens"} for x in record["lengths"]]}))
        done[step] = reproduce_tasks(out, *extra)
        assert done[step].returncode == 0, f"{step}:\n" + done[step].stdout[-3000:] + done[step].stderr[-3000:]
        if step == "challenger":
            done["challenger report"] = (out / "report.md").read_text()
        if step == "every method":  # the one-seed report, before the two-seed steps rewrite it
            done["one-seed results"] = json.loads((out / "results.json").read_text())
            done["one-seed report"] = (out / "report.md").read_text()
    return out, done


@pytest.mark.e2e
@pytest.mark.slow
def test_cpu_tiny_suite_writes_a_report_for_every_method(tiny_suite):
    out, done = tiny_suite
    results = done["one-seed results"]
    assert results["methods"] == ["baseline", "posaug", "rfs", "rpe", "warp", "nope", "alibi", "rfs_alibi"]
    for record in results["records"]:
        assert [r["length"] for r in record["lengths"]] == list(range(1, 13))
        assert all(0.0 <= r["accuracy"] <= 1.0 for r in record["lengths"])
        assert [r["seen"] for r in record["lengths"]] == [True] * 3 + [False] * 9
    report = done["one-seed report"]
    # 3 steps learn nothing: the gate marks copy and no ranking is computed from it.
    assert "| copy (not learned — no verdict) |" in report and (out / "accuracy_copy.png").stat().st_size > 0
    assert results["gate"]["copy"]["passed"] is False and results["ranking"]["accuracy"] == []
    assert all("token_accuracy" in r for record in results["records"] for r in record["lengths"])
    assert len(results["timing"]["per_run_train_cpu_s"]) == 8 and results["timing"]["train_cpu_s"] > 0
    assert "**estimated** wall time" in report and "## Against the RoPE baseline" in report


@pytest.mark.e2e
@pytest.mark.slow
def test_training_and_evaluation_workers_print_no_known_harmless_warning(tiny_suite):
    _, done = tiny_suite
    assert "Warning" not in done["every method"].stderr + done["every method"].stdout


@pytest.mark.e2e
@pytest.mark.slow
def test_a_rerun_of_a_finished_suite_trains_and_evaluates_nothing(tiny_suite):
    _, done = tiny_suite
    assert "to train" not in done["every method again"].stdout and "[eval" not in done["every method again"].stdout


@pytest.mark.e2e
@pytest.mark.slow
def test_two_seeds_report_mean_and_spread(tiny_suite):
    out, _ = tiny_suite
    results = json.loads((out / "results.json").read_text())
    assert results["seeds"] == [42, 137]
    unseen = results["summary"]["copy"]["rfs"]["unseen"]
    assert [p["seed"] for p in unseen["per_seed"]] == [42, 137] and unseen["sd"] >= 0.0


@pytest.mark.e2e
@pytest.mark.slow
def test_an_evaluation_without_per_example_scores_is_redone_to_the_same_counts(tiny_suite):
    out, done = tiny_suite
    assert "re-evaluating 1 run(s) evaluated before per-example scores were stored" in done["two seeds"].stdout
    again = json.loads((out / "eval" / "copy_baseline_s42.json").read_text())
    assert again["lengths"] == done["former evaluation"]["lengths"]
    assert not list((out / "eval").glob("*.before-examples.json"))


@pytest.mark.e2e
@pytest.mark.slow
def test_results_json_keeps_per_example_scores_out_and_the_report_compares_posaug_with_each_row(tiny_suite):
    _, done = tiny_suite
    results = done["one-seed results"]
    assert not any("example_tokens" in x for record in results["records"] for x in record["lengths"])
    # 3 steps learn nothing, so no task passes the gate and no pair gets a verdict.
    assert results["versus_posaug"]["accuracy"]["rfs"] == {}
    assert "## posaug against each row, beyond N" in done["one-seed report"]


@pytest.mark.e2e
@pytest.mark.slow
def test_a_report_only_rerun_trains_nothing(tiny_suite):
    _, done = tiny_suite
    report_only = done["two seeds, report only"].stdout
    assert "to train" not in report_only and "[eval" not in report_only


@pytest.mark.e2e
@pytest.mark.slow
def test_every_training_invocation_is_recorded_and_a_report_only_one_is_not(tiny_suite):
    out, _ = tiny_suite
    invocations = json.loads((out / "timing" / "invocations.json").read_text())
    # baseline; the 7 other methods; the rerun trains nothing; ryarn alone; baseline and RFS of seed 137; report only
    assert [r["runs_trained"] for r in invocations] == [1, 7, 0, 1, 2] and all(r["wall_s"] > 0 for r in invocations)
    assert "in 5 invocation(s) on this output directory" in (out / "report.md").read_text()


@pytest.mark.e2e
@pytest.mark.slow
def test_the_randomized_yarn_row_trains_beside_the_stored_baseline_and_the_report_states_its_deviation(tiny_suite):
    from pretrain.tasks.report import METHOD_DEVIATIONS

    _, done = tiny_suite
    assert "| ryarn |" in done["challenger report"] and METHOD_DEVIATIONS["ryarn"] in done["challenger report"]
    assert "Warning" not in done["challenger"].stderr + done["challenger"].stdout


def test_unknown_method_is_one_line_and_exit_code_2(tmp_path):
    proc = reproduce_tasks(tmp_path, "--methods", "baseline", "kerple")
    assert proc.returncode == 2 and "kerple" in proc.stderr and "Traceback" not in proc.stderr


def test_the_former_method_name_rope_is_refused_naming_baseline(tmp_path):
    proc = reproduce_tasks(tmp_path, "--methods", "rope")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1
    assert "rope is now baseline" in proc.stderr


def test_report_only_without_evaluations_is_one_line_and_exit_code_2(tmp_path):
    proc = reproduce_tasks(tmp_path, "--report-only")
    assert proc.returncode == 2 and "run without --report-only first" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.e2e
@pytest.mark.slow
def test_the_papers_protocol_trains_to_40_and_evaluates_41_to_500_scaled_down(tmp_path):
    # one method: the protocol's lengths are the preset's, the same for every row; each row decodes 500 tokens
    # greedily with the 5-layer model (~30 CPU-s a row)
    proc = reproduce_tasks(tmp_path, "--tasks", "copy", "--methods", "rpe", "--train-iters", "2",
                           "--eval-count", "2", "--eval-stride", "460", "--jobs", "1", preset="papers-protocol")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    lengths = [r["length"] for r in results["records"][0]["lengths"]]
    assert lengths == list(range(1, 41)) + [500]  # the stride from 40 reaches 500 exactly
    assert "Scaled down on the command line: --train-iters 2" in (tmp_path / "report.md").read_text()


def test_jobs_below_one_is_one_line_and_exit_code_2(tmp_path):
    proc = reproduce_tasks(tmp_path, "--jobs", "0")
    assert proc.returncode == 2 and "--jobs 0 must be >= 1" in proc.stderr and "Traceback" not in proc.stderr


def task_config(**data):
    return config_module.from_dict({"preset": "tiny", "model": {"seq_length": 24, "vocab_size": 64},
                                    "data": {"task": "copy", "task_max_length": 10, **data},
                                    "schedule": {"train_iters": 2, "global_batch_size": 2, "micro_batch_size": 2}})


def test_a_task_config_validates_without_data_path():
    task_config().validate(world_size=1)


@pytest.mark.parametrize("data, message", [
    ({"task": "parity"}, "data.task='parity' is not a task"),
    ({"task_max_length": 30}, "model.seq_length >= 64"),
    ({"task_min_length": 0}, "data.task_min_length must be >= 1"),
])
def test_bad_task_settings_name_the_field_and_fix(data, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("+", r"\+")):
        task_config(**data).validate(world_size=1)


def test_the_long_preset_covers_every_task_and_default_method_at_200_examples_per_length_up_to_4n():
    from pretrain.tasks.generators import TASKS
    from pretrain.tasks.presets import DEFAULT_METHODS
    from pretrain.tasks.suite import PRESETS

    long = PRESETS["cpu-long"]
    assert set(long.tasks) == set(TASKS) and set(long.methods) == set(DEFAULT_METHODS)
    assert long.eval_count >= 200 and long.eval_factor >= 4


def test_the_papers_protocol_trains_on_lengths_up_to_40_and_tests_41_to_500():
    from pretrain.tasks.suite import PRESETS

    protocol = PRESETS["papers-protocol"]
    assert {"copy", "reverse", "sort"} <= set(protocol.tasks)
    for task, (lo, hi) in protocol.tasks.items():
        assert (lo, hi) == (1, 40) and protocol.eval_lengths(task, 1) == list(range(1, 501))


def test_every_preset_task_budget_builds_a_valid_training_config(tmp_path):
    from pretrain.tasks.suite import PRESETS, run_config

    for name, preset in PRESETS.items():
        for task in preset.tasks:
            for method in preset.methods:
                config = config_module.from_dict(run_config(preset, task, method, 42, tmp_path / f"{name}_{task}"))
                config.validate(world_size=1)
                assert config.schedule.train_iters == preset.iters(task)



MODERN_ROWS = ("prope", "irope", "ssmax", "pose", "posaug_prope", "posaug_irope", "swa_hybrid", "posaug_swa_hybrid")
# Opt-in rows: what current models ship and the 2026 challengers (Randomized YaRN, DroPE).
OPT_IN_ROWS = (*MODERN_ROWS, "ryarn", "drope", "drope_2x", "posaug_drope")


def test_the_rows_current_models_ship_and_the_challengers_are_opt_in_and_the_defaults_stay_the_eight_rows():
    from pretrain.tasks.suite import METHODS, PRESETS

    assert set(OPT_IN_ROWS) <= set(METHODS)
    for preset in PRESETS.values():
        assert not set(OPT_IN_ROWS) & set(preset.methods)
    assert PRESETS["cpu-long"].methods == ("baseline", "posaug", "rfs", "rpe", "warp", "nope", "alibi", "rfs_alibi")


def test_every_opt_in_row_builds_a_valid_config_for_every_task_of_cpu_long(tmp_path):
    from pretrain.tasks.suite import PRESETS, run_config

    preset = PRESETS["cpu-long"]
    for task in preset.tasks:
        for method in OPT_IN_ROWS:
            config = config_module.from_dict(run_config(preset, task, method, 42, tmp_path / f"{task}_{method}"))
            config.validate(world_size=1)


def test_the_irope_row_makes_the_probe_models_last_layer_nope_with_the_temperature_floor_at_the_window(tmp_path):
    from pretrain.tasks.suite import PRESETS, run_config, sequence_tokens

    preset = PRESETS["cpu-long"]
    raw = run_config(preset, "copy", "irope", 42, tmp_path / "r")
    layers = raw["model"]["num_layers"]
    assert layers == 3 and raw["model"]["no_rope_freq"] == layers  # layer 3 of 3 without RoPE
    assert raw["model"]["attn_temperature_floor"] == sequence_tokens("copy", preset.tasks["copy"][1])
    assert raw["positions"] == {"strategy": "none"}


def test_the_ssmax_and_pose_rows_follow_the_lm_tables_rules_at_the_tasks_window(tmp_path):
    import math

    from pretrain.tasks.suite import PRESETS, run_config, sequence_tokens

    preset = PRESETS["cpu-long"]
    window = sequence_tokens("reverse", preset.tasks["reverse"][1])
    assert run_config(preset, "reverse", "ssmax", 42, tmp_path / "s")["model"]["ssmax_scale"] == \
        pytest.approx(1 / math.log(window))
    pose = run_config(preset, "reverse", "pose", 42, tmp_path / "p")["positions"]
    assert pose["strategy"] == "pose" and pose["max_position"] == 8 * window


def test_the_ryarn_row_draws_from_the_longest_evaluation_input_as_the_rpe_row_does(tmp_path):
    from pretrain.tasks.suite import PRESETS, run_config, sequence_tokens

    preset = PRESETS["cpu-long"]
    ryarn = run_config(preset, "reverse", "ryarn", 42, tmp_path / "y")["positions"]
    rpe = run_config(preset, "reverse", "rpe", 42, tmp_path / "r")["positions"]
    longest = sequence_tokens("reverse", preset.eval_max("reverse"))
    assert ryarn == {"strategy": "ryarn", "max_position": longest} and rpe["max_position"] == longest


def test_the_drope_rows_drop_rope_for_the_last_share_of_each_tasks_steps_at_the_baselines_budget(tmp_path):
    from megatron_ext.positions.drope import switch_step
    from pretrain.tasks.suite import PRESETS, run_config

    for name in ("cpu-tiny", "cpu-long"):
        preset = PRESETS[name]
        for task in preset.tasks:
            baseline = config_module.from_dict(run_config(preset, task, "baseline", 42, tmp_path / f"{name}_b"))
            for method, share in (("drope", 0.02), ("drope_2x", 0.04), ("posaug_drope", 0.02)):
                config = config_module.from_dict(run_config(preset, task, method, 42, tmp_path / f"{name}_{method}"))
                config.validate(world_size=1)
                steps = config.schedule.train_iters
                assert steps == baseline.schedule.train_iters and config.positions.drope_share == share
                assert 0 < switch_step(steps, share) < steps, (name, task, method)
