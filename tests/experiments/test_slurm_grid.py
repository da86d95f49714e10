"""`reproduce --slurm` without a cluster: the paper grid's dry run (jobs, dependencies, GPU-hours) and refusals.

The real submissions (cpu-tiny on the local SLURM cluster, resume after a killed job) are in
tests/slurm/test_grid_on_cluster.py.
"""

import os
import re
import subprocess
import sys

import pytest

from conftest import REPO
from pretrain.experiments.slurm_grid import PAPER_SEEDS, Spec, parse_run_name, run_name
from pretrain.experiments.slurm_grid import main as grid_main
from pretrain.experiments.slurm_grid import make_spec, parser
from pretrain.experiments.presets import PRESETS, TRAINING_METHODS
from pretrain.table import SHIPPED_METHODS, TABLE1_SIZES

PY = sys.executable


def reproduce(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "pretrain", "reproduce", "--slurm", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


def _corpus_and_tokenizer(root) -> tuple[str, str]:
    """An (empty) corpus directory and tokenizer file: the grid checks that both exist before planning."""
    (root / "corpus").mkdir()
    (root / "tokenizer.json").write_text("{}")
    return str(root / "corpus"), str(root / "tokenizer.json")


@pytest.fixture(scope="module")
def paper_dry_run(tmp_path_factory):
    """The whole paper grid, shards still to build: its plan and the sbatch script it would run."""
    root = tmp_path_factory.mktemp("paper")
    corpus, tokenizer = _corpus_and_tokenizer(root)
    proc = reproduce("--dry-run", "--output", str(root / "grid"), "--data-prefix", str(root / "shards" / "owt"),
                     "--input", corpus, "--tokenizer", tokenizer)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    commands = [line for line in proc.stdout.splitlines() if re.match(r"^\w+=\$\(", line)]
    return root, proc.stdout, {line.split("=", 1)[0]: line for line in commands}


def test_run_names_are_the_launchers_and_parse_back():
    assert run_name("113m", "posaug", 2024) == "113m_posaug_seed2024"
    assert parse_run_name("cpu-small_posaug_step_seed137") == ("cpu-small", "posaug_step", 137)


def test_spec_survives_its_json_form():
    spec = Spec(preset="paper", out="/x", sizes=("10m",), methods=("baseline", "rfs"), seeds=(42, 137),
                data_prefix="/d/owt", gpu="h100-80gb", sets=("schedule.train_iters=5",), sbatch=("--partition=gpu",))
    assert Spec.from_json(spec.to_json()) == spec


@pytest.mark.e2e
@pytest.mark.slow
def test_paper_dry_run_submits_data_then_one_array_per_size_and_method_one_eval_per_run_and_a_report(paper_dry_run):
    root, stdout, commands = paper_dry_run
    runs = len(TABLE1_SIZES) * len(SHIPPED_METHODS)
    assert len(commands) == 1 + runs + runs * len(PAPER_SEEDS) + 1
    assert f"# dry run: {len(commands)} sbatch command(s), nothing submitted" in stdout
    assert "slurm/data_prep.sh" in commands["DATA"] and f"DATA_PREFIX={root / 'shards' / 'owt'}" in commands["DATA"]
    for size in TABLE1_SIZES:
        for method in SHIPPED_METHODS:
            train = commands[f"TRAIN_{size}_{method}".upper()]
            assert train.endswith(f"slurm/pretrain_{size}_{method}.sh)")
            assert "--array=0,1,2" in train and "SEEDS='42 137 2024'" in train
            assert '"--dependency=afterok:${DATA}"' in train
            for index, seed in enumerate(PAPER_SEEDS):
                evaluation = commands[f"EVAL_{size}_{method}_seed{seed}".upper()]
                train_var = f"TRAIN_{size}_{method}".upper()
                assert f'"--dependency=afterok:${{{train_var}}}_{index}"' in evaluation
                assert evaluation.endswith(f"reproduce_stage.sh eval {root / 'grid'} {size}_{method}_seed{seed})")
    report = re.search(r"--dependency=afterany:([^\"]+)", commands["REPORT"]).group(1)
    assert sorted(report.split(":")) == sorted(f"${{{name}}}" for name in commands if name.startswith("EVAL_"))
    assert not (root / "grid").exists()  # a dry run writes nothing


@pytest.mark.e2e
@pytest.mark.slow
def test_paper_dry_run_total_gpu_hours_are_plan_sweeps_times_the_seeds(paper_dry_run):
    _, stdout, _ = paper_dry_run
    sweep = subprocess.run([PY, "-m", "pretrain", "plan", "--sweep"], cwd=REPO, capture_output=True, text=True,
                           timeout=600)
    assert sweep.returncode == 0, sweep.stderr
    sweep_total = float(re.search(r"^total\s+([\d,.]+)\s+[\d,.]+$", sweep.stdout, re.M).group(1).replace(",", ""))
    runs, total = re.search(r"^total\s+(\d+)\s+([\d,.]+)\s*$", stdout, re.M).groups()
    assert int(runs) == len(TABLE1_SIZES) * len(SHIPPED_METHODS) * len(PAPER_SEEDS)
    assert float(total.replace(",", "")) == pytest.approx(3 * sweep_total, abs=0.15)  # both printed to 0.1


@pytest.mark.e2e
@pytest.mark.slow
def test_a_grid_whose_runs_do_not_fit_is_refused_in_one_line_and_writes_nothing(tmp_path):
    corpus, tokenizer = _corpus_and_tokenizer(tmp_path)
    proc = reproduce("--sizes", "10m", "--set", "schedule.micro_batch_size=128", "--output", str(tmp_path / "grid"),
                     "--data-prefix", str(tmp_path / "owt"), "--input", corpus, "--tokenizer", tokenizer)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1
    assert proc.stderr.startswith("error: the grid does not fit, nothing was submitted: 10m_baseline: predicted peak")
    others = len(SHIPPED_METHODS) - 1  # every other method of the 10m grid does not fit either
    assert "schedule.micro_batch_size=64" in proc.stderr and f"(and {others} more run(s) of the grid)" in proc.stderr
    assert re.search(r"^10m_posaug .* NO ", proc.stdout, re.M)  # the plan is printed first
    assert not (tmp_path / "grid").exists()


@pytest.mark.parametrize("args, message", [
    (["--methods", "nope"], "error: --methods nope: the paper grid has methods baseline, posaug, rfs, rpe, warp"),
    (["--sizes", "7b"], "error: --sizes 7b: the paper grid has sizes 10m, 42m, 113m, 425m, 1b"),
    (["--seeds", "42,42"], "error: --seeds 42,42: a seed appears twice"),
    ([], "error: --preset paper needs --data-prefix"),
    (["--data-prefix", "/d/owt", "--input", "/nonexistent/c", "--tokenizer", "/nonexistent/t"],
     "error: --input /nonexistent/c does not exist"),
    (["--preset", "cpu-tiny", "--tokenizer", "/t"], "error: --preset cpu-tiny builds its own data"),
])
def test_bad_grid_arguments_are_one_line_naming_the_flag(tmp_path, capsys, args, message):
    assert grid_main(["--slurm", "--dry-run", "--output", str(tmp_path / "grid"), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1, err


def test_the_former_name_of_the_baseline_is_refused_naming_the_current_one(tmp_path, capsys):
    assert grid_main(["--slurm", "--dry-run", "--output", str(tmp_path / "grid"), "--methods", "rope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --methods rope: the paper grid has methods baseline,") and err.count("\n") == 1
    assert err.rstrip().endswith("; rope is now baseline (one name for the baseline everywhere)")


def test_a_submission_without_shards_or_the_means_to_build_them_is_refused(tmp_path, capsys):
    assert grid_main(["--slurm", "--output", str(tmp_path / "grid"), "--data-prefix", "/nonexistent/owt"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no shards at --data-prefix /nonexistent/owt (no manifest): pass --input and "
                          "--tokenizer") and not (tmp_path / "grid").exists()


def test_a_seed_given_as_a_count_is_refused_with_the_num_seeds_hint(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        grid_main(["--slurm", "--dry-run", "--output", str(tmp_path / "grid"), "--data-prefix", "/d", "--seeds", "2"])
    assert exit_.value.code == 2 and "--num-seeds 2" in capsys.readouterr().err


@pytest.mark.e2e
@pytest.mark.slow
def test_a_dry_run_before_the_shards_exist_plans_then_refuses_as_the_submission_does(tmp_path):
    proc = reproduce("--dry-run", "--sizes", "10m", "--methods", "posaug", "--num-seeds", "1", "--output",
                     str(tmp_path / "grid"), "--data-prefix", str(tmp_path / "owt"), timeout=300)
    assert re.search(r"^10m_posaug ", proc.stdout, re.M)  # the plan and the commands come first
    assert "# dry run: " in proc.stdout and "nothing submitted" in proc.stdout
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr == (f"error: no shards at --data-prefix {tmp_path / 'owt'} (no manifest): pass --input and "
                           "--tokenizer to build them in a data_prep job first, or the prefix of existing shards\n")
    assert not (tmp_path / "grid").exists()


def test_status_of_a_grid_never_submitted_says_how_to_submit_it(tmp_path, capsys):
    assert grid_main(["--slurm", "--preset", "cpu-tiny", "--status", "--output", str(tmp_path)]) == 2
    expected = f"error: no grid at {tmp_path}: run the same command without --status to submit it\n"
    assert capsys.readouterr().err == expected


@pytest.mark.e2e
@pytest.mark.slow
def test_cpu_preset_dry_run_trains_on_cpu_nodes_and_the_users_sbatch_options_come_last(tmp_path):
    proc = reproduce("--preset", "cpu-tiny", "--methods", "rfs", "--dry-run", "--output", str(tmp_path / "grid"),
                     "--sbatch", "--partition=cpu --nodes=2", timeout=300)
    assert proc.returncode == 0, proc.stderr
    train = next(line for line in proc.stdout.splitlines() if line.startswith("TRAIN_TINY_RFS="))
    assert f"CONFIG={tmp_path / 'grid' / 'configs' / 'tiny_rfs.yaml'}" in train
    assert "RUN_NAME='tiny_rfs_seed{seed}'" in train
    assert "--gpus-per-node=0" in train
    assert train.endswith(f"--partition=cpu --nodes=2 {REPO}/slurm/pretrain_10m_rfs.sh)")
    assert train.index("--nodes=1") < train.index("--nodes=2")  # sbatch: the last of an option wins
    data = next(line for line in proc.stdout.splitlines() if line.startswith("DATA="))
    assert data.endswith(f"--partition=cpu --nodes=2 {REPO}/slurm/reproduce_stage.sh data {tmp_path / 'grid'})")


def test_a_launchers_run_name_pattern_takes_each_array_tasks_seed(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_"))}
    env.update(RUN_NAME="tiny_rfs_seed{seed}", SEEDS="42 137", SLURM_ARRAY_TASK_ID="1", OUTPUT_DIR=str(tmp_path),
               SYNTHETIC_DATA="1")  # without data the dry run ends with the pre-flight refusal (exit 2)
    proc = subprocess.run(["bash", str(REPO / "slurm" / "pretrain_10m_rfs.sh"), "--dry-run"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"\n  run dir         {tmp_path}/tiny_rfs_seed137\n" in proc.stdout
    assert "name=tiny_rfs_seed137 seed=137 " in proc.stdout


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_a_presets_grid_takes_every_method_its_local_reproduce_takes(tmp_path, preset):
    from pretrain.experiments.reproduce import with_methods

    args = parser().parse_args(["--slurm", "--preset", preset, "--output", str(tmp_path), "--methods",
                                *TRAINING_METHODS])
    assert make_spec(args).methods == TRAINING_METHODS
    assert with_methods(PRESETS[preset], list(TRAINING_METHODS)).methods == TRAINING_METHODS  # the same list


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_a_presets_grid_refuses_a_method_local_reproduce_refuses_listing_what_both_take(tmp_path, preset):
    from pretrain.experiments.reproduce import with_methods

    args = parser().parse_args(["--slurm", "--preset", preset, "--output", str(tmp_path), "--methods", "p_rope"])
    with pytest.raises(ValueError, match=f"^--methods p_rope: the {preset} grid has methods "
                                         f"{', '.join(TRAINING_METHODS)}$"):
        make_spec(args)
    with pytest.raises(ValueError):
        with_methods(PRESETS[preset], ["p_rope"])


def test_a_presets_grid_without_methods_is_its_default_rows(tmp_path):
    args = parser().parse_args(["--slurm", "--preset", "cpu-small", "--output", str(tmp_path)])
    assert make_spec(args).methods == PRESETS["cpu-small"].methods


def test_the_paper_grid_takes_the_posaug_compositions(tmp_path):
    args = parser().parse_args(["--slurm", "--dry-run", "--sizes", "10m", "--methods", "posaug_prope", "posaug_irope",
                                "ssmax", "--output", str(tmp_path), "--data-prefix", str(tmp_path / "owt")])
    assert make_spec(args).methods == ("baseline", "ssmax", "posaug_prope", "posaug_irope")


def test_the_paper_grids_methods_are_the_shipped_ones(tmp_path):
    args = parser().parse_args(["--slurm", "--dry-run", "--output", str(tmp_path), "--data-prefix", str(tmp_path)])
    assert make_spec(args).methods == SHIPPED_METHODS and {"posaug_prope", "posaug_irope"} <= set(SHIPPED_METHODS)


@pytest.mark.e2e
@pytest.mark.slow
def test_gpu_preset_dry_run_trains_and_evaluates_on_gpu_nodes_through_the_10m_launchers(tmp_path):
    proc = reproduce("--preset", "gpu-10m", "--methods", "posaug_irope", "nope", "--dry-run", "--output",
                     str(tmp_path / "grid"), timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "runs on the launchers' nodes" in proc.stdout
    lines = {line.split("=", 1)[0]: line for line in proc.stdout.splitlines() if re.match(r"^\w+=\$\(", line)}
    train, nope = lines["TRAIN_10M_POSAUG_IROPE"], lines["TRAIN_10M_NOPE"]
    assert f"CONFIG={tmp_path / 'grid' / 'configs' / '10m_posaug_irope.yaml'}" in train
    assert train.endswith(f"{REPO}/slurm/pretrain_10m_posaug_irope.sh)")
    assert nope.endswith(f"{REPO}/slurm/pretrain_10m_baseline.sh)")  # no shipped nope launcher: its config says it
    assert "--gpus-per-node=0" not in train and "--time=60" not in train  # the launcher's 1 GPU and --time
    assert "--gpus-per-node=1" in lines["EVAL_10M_POSAUG_IROPE_SEED42"]
    assert not (tmp_path / "grid").exists()
