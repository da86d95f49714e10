"""Weights & Biases tracking (`logging.wandb`): the same scalars as TensorBoard, one W&B run across resumes,
config-time errors. Runs are offline; their `.wandb` files are read back with wandb's own reader
(`wandb leet inspect --json`)."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, tensorboard_scalars, wait_for_step

TINY = ["preset=tiny", "model.vocab_size=512", "schedule.global_batch_size=8", "schedule.micro_batch_size=2",
        "optimizer.lr=3e-3", "optimizer.min_lr=3e-4", "optimizer.lr_warmup_iters=2", "logging.log_interval=1",
        "logging.eval_interval=3", "logging.eval_iters=1", "data.synthetic=true", "positions.strategy=posaug",
        "logging.wandb.project=pretrain-tests", "logging.wandb.mode=offline"]
TB_TAGS = ("train/loss", "train/lr", "train/grad_norm", "positions/alpha", "perf/tokens_per_s", "perf/mfu",
           "valid/loss")


def _env(tmp_path: Path) -> dict:
    """No credentials, wandb's own config/cache under tmp_path: nothing can reach a server or the user's files."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="", NETRC=str(tmp_path / "no-netrc"),
               WANDB_CONFIG_DIR=str(tmp_path / "wandb-config"), WANDB_CACHE_DIR=str(tmp_path / "wandb-cache"),
               WANDB_DATA_DIR=str(tmp_path / "wandb-data"), WANDB_ERROR_REPORTING="false")
    return env


def _train(run_dir: Path, env: dict, *extra: str, timeout: float = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "pretrain", "train", "--set", *TINY, f"checkpoint.save={run_dir}",
                           *extra], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"training failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def wandb_records(run_dir: Path, env: dict) -> list[list[dict]]:
    """Every offline start of the run (oldest first), each as its list of records, via `wandb leet inspect`."""
    starts = []
    for directory in sorted((run_dir / "wandb").glob("offline-run-*")):
        out = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(directory)],
                             env={**env, "WANDB_MODE": "offline"}, capture_output=True, text=True, timeout=120,
                             check=True).stdout
        starts.append([json.loads(line) for line in out.splitlines() if line.strip()])
    return starts


def history(records: list[dict]) -> list[dict]:
    """The history rows of one start: {"_step": n, tag: value, ...}."""
    return [r["history"]["item"] for r in records if r["type"] == "history"]


@pytest.fixture(scope="module")
def offline_run(tmp_path_factory):
    """Four offline steps of a run named tiny_posaug: (run dir, env, training stdout, training stderr)."""
    tmp_path = tmp_path_factory.mktemp("wandb_offline")
    env, run_dir = _env(tmp_path), tmp_path / "run"
    proc = _train(run_dir, env, "schedule.train_iters=4", "name=tiny_posaug")
    return run_dir, env, proc.stdout, proc.stderr


@pytest.mark.slow
def test_offline_run_holds_the_same_scalar_series_as_tensorboard(offline_run):
    run_dir, env, _, _ = offline_run
    [records] = wandb_records(run_dir, env)
    rows = history(records)
    assert [row["_step"] for row in rows] == [1, 2, 3, 4]
    for tag in TB_TAGS:
        expected = tensorboard_scalars(run_dir, tag)
        got = {row["_step"]: row[tag] for row in rows if tag in row}
        assert expected and sorted(got) == sorted(expected), tag
        for step, value in expected.items():  # TensorBoard stores float32, W&B the float64
            assert got[step] == pytest.approx(value, rel=1e-6), (tag, step)
    assert not any(k.startswith("valid/") for k in rows[1]), "validation only at eval_interval"


@pytest.mark.slow
def test_training_prints_one_wandb_line_and_nothing_of_wandb_on_stderr(offline_run):
    _, _, stdout, stderr = offline_run
    assert [line for line in stdout.splitlines() if "W&B" in line][0].startswith("W&B: offline run tiny_posaug-")
    assert "wandb sync" in stdout
    assert "wandb" not in stderr.lower(), stderr  # no banner lines or warnings of wandb's own


@pytest.mark.slow
def test_wandb_run_is_named_after_the_run_and_holds_the_resolved_config(offline_run):
    run_dir, env, _, _ = offline_run
    [records] = wandb_records(run_dir, env)
    [run] = [r["run"] for r in records if r["type"] == "run"]
    state = json.loads((run_dir / "wandb" / "run.json").read_text())
    assert run["display_name"] == "tiny_posaug" and run["run_id"] == state["id"]
    assert run["project"] == "pretrain-tests"
    config = run["config"]["update"]
    assert config["positions"]["strategy"] == "posaug" and config["model"]["num_layers"] >= 1
    assert config["train_iters"] == 4 and config["logging"]["wandb"]["mode"] == "offline"


@pytest.mark.slow
def test_two_stage_pipeline_logs_one_wandb_run_from_rank_0_with_the_last_stages_scalars(tmp_path):
    env, run_dir = _env(tmp_path), tmp_path / "run"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "pretrain",
               "train", "--set", *TINY, f"checkpoint.save={run_dir}", "schedule.train_iters=3",
               "parallel.pipeline_model_parallel_size=2"]
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [records] = wandb_records(run_dir, env)  # one start: rank 1 wrote no W&B run
    rows = history(records)
    # TensorBoard is written by the last stage, W&B by rank 0: the loss reaches both (perf/* are each rank's clock)
    for tag in ("train/loss", "train/lr", "train/grad_norm", "positions/alpha", "valid/loss"):
        expected = tensorboard_scalars(run_dir, tag)
        got = {row["_step"]: row[tag] for row in rows if tag in row}
        assert sorted(got) == sorted(expected) and expected, tag
        assert all(got[s] == pytest.approx(v, rel=1e-6) for s, v in expected.items()), tag
    assert all("perf/tokens_per_s" in row for row in rows)


@pytest.mark.slow
def test_unreachable_server_falls_back_to_an_offline_run_and_says_so(tmp_path):
    env, run_dir = _env(tmp_path), tmp_path / "run"
    env.update(WANDB_API_KEY="0" * 40, WANDB_BASE_URL="http://127.0.0.1:9", WANDB_INIT_TIMEOUT="5")  # nothing listens
    proc = _train(run_dir, env, "schedule.train_iters=3", "logging.wandb.mode=online")
    line = next(line for line in proc.stdout.splitlines() if line.startswith("W&B:"))
    assert line.startswith("W&B: offline run") and "online start failed" in line, line
    [records] = wandb_records(run_dir, env)
    assert [row["_step"] for row in history(records)] == [1, 2, 3]


@pytest.mark.slow
def test_kill_and_resume_continue_one_wandb_run_without_duplicate_steps(tmp_path):
    env, run_dir = _env(tmp_path), tmp_path / "run"
    overrides = ["schedule.train_iters=6", "checkpoint.save_interval=2", "checkpoint.keep_last=5"]
    proc = subprocess.Popen([sys.executable, "-m", "pretrain", "train", "--set", *TINY, f"checkpoint.save={run_dir}",
                             *overrides], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    wait_for_step(proc, 5)  # checkpoint 4 is complete; steps 1-5 are logged
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    killed_state = json.loads((run_dir / "wandb" / "run.json").read_text())
    resumed = _train(run_dir, env, *overrides)
    assert "resumed from iteration 4" in resumed.stdout

    starts = wandb_records(run_dir, env)
    assert len(starts) == 2
    ids = {r["run"]["run_id"] for records in starts for r in records if r["type"] == "run"}
    assert ids == {killed_state["id"]}
    steps = [row["_step"] for records in starts for row in history(records)]
    assert steps == sorted(set(steps)), f"duplicated or unordered steps {steps}"
    assert [row["_step"] for row in history(starts[1])] == [s for s in range(1, 7) if s > killed_state["last_step"]]
    assert set(steps) <= set(range(1, 7)) and 6 in steps
    # the resumed process logs exactly what it recomputed (TensorBoard keeps the later files' values)
    expected = tensorboard_scalars(run_dir, "train/loss")
    for row in history(starts[1]):
        assert row["train/loss"] == pytest.approx(expected[row["_step"]], rel=1e-6)


def _one_error_line(proc) -> str:
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr[-4000:]
    return errors[0]


@pytest.mark.slow  # a training subprocess up to its first W&B write
@pytest.mark.parametrize("fault", ["read_only", "full"])
def test_wandb_directory_on_a_read_only_or_full_disk_is_one_line_exit_2(small_disk, tmp_path, fault):
    disk = small_disk("1m")
    disk.read_only() if fault == "read_only" else disk.fill(leave=0)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "wandb").symlink_to(disk.path)  # only the W&B files land on the bad disk
    proc = subprocess.run([sys.executable, "-m", "pretrain", "train", "--set", *TINY, f"checkpoint.save={run_dir}",
                           "schedule.train_iters=3"], cwd=REPO, env=_env(tmp_path), capture_output=True, text=True,
                          timeout=300)
    line = _one_error_line(proc)
    assert "W&B files" in line and ("Read-only file system" in line or "No space left on device" in line), line
    assert json.loads((run_dir / "status.json").read_text())["state"] == "failed"
    assert not list(disk.path.glob("*.tmp")), "a half-written run.json stayed behind"


# --- configuration (fast, no training) ---

def _config(*overrides: str):
    from pretrain.trainer import config

    return config.load(None, ["data.synthetic=true", "preset=tiny", "schedule.train_iters=2",
                              "schedule.global_batch_size=8", "schedule.micro_batch_size=2", *overrides])


def test_missing_wandb_package_fails_config_validation_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # how Python marks a module as not importable
    config = _config("logging.wandb.project=p", "logging.wandb.mode=offline")
    with pytest.raises(ValueError, match=r"wandb package is not installed.*\.\[wandb\]"):
        config.validate(world_size=1)


def test_missing_wandb_package_exits_2_with_one_line_before_training(tmp_path):
    code = ("import sys; sys.modules['wandb'] = None; from pretrain.__main__ import main; "
            f"sys.exit(main(['train', '--set', 'data.synthetic=true', 'preset=tiny', 'schedule.train_iters=2', "
            f"'schedule.global_batch_size=8', 'schedule.micro_batch_size=2', 'checkpoint.save={tmp_path / 'run'}', "
            f"'logging.wandb.project=p']))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=_env(tmp_path), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: logging.wandb is set but the wandb package"), proc.stderr
    assert not (tmp_path / "run").exists()


def test_disabled_mode_needs_no_wandb_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    _config("logging.wandb.mode=disabled").validate(world_size=1)


def test_disabled_mode_writes_nothing_of_wandb(tmp_path, monkeypatch):
    from pretrain.trainer.tracking import TensorBoardSink, open_trackers

    monkeypatch.setitem(sys.modules, "wandb", None)  # disabled must not even import it
    config = _config("logging.wandb.mode=disabled", f"checkpoint.save={tmp_path}")
    trackers = open_trackers(config, rank=0, world=1, resolved={})
    trackers.log(1, {"train/loss": 1.0})
    trackers.close()
    assert [type(s) for s in trackers.sinks] == [TensorBoardSink]
    assert not (tmp_path / "wandb").exists() and list((tmp_path / "tensorboard").iterdir())


def test_online_mode_without_api_key_fails_config_validation(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_IDENTITY_TOKEN_FILE", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "absent"))
    with pytest.raises(ValueError, match=r"mode=online but no W&B API key.*mode=offline"):
        _config("logging.wandb.mode=online").validate(world_size=1)


def test_mode_defaults_to_offline_without_api_key_and_online_with_one(tmp_path, monkeypatch):
    from pretrain.trainer.tracking import resolve_mode

    for name in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_MODE", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    netrc = tmp_path / "netrc"
    monkeypatch.setenv("NETRC", str(netrc))
    assert resolve_mode(None) == "offline"
    netrc.write_text("machine api.wandb.ai\n  login user\n  password " + "a" * 40 + "\n")
    netrc.chmod(0o600)
    assert resolve_mode(None) == "online"
    assert resolve_mode("offline") == "offline"  # the config wins
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert resolve_mode(None) == "disabled"


def test_wandb_section_accepts_nested_overrides_and_rejects_unknown_fields():
    config = _config("logging.wandb.project=posaug", "logging.wandb.entity=my-team")
    assert (config.logging.wandb.project, config.logging.wandb.entity, config.logging.wandb.mode) == \
        ("posaug", "my-team", None)
    with pytest.raises(ValueError, match=r"logging.wandb.projct: unknown field 'projct'; allowed: entity, mode, project"):
        _config("logging.wandb.projct=posaug")
    with pytest.raises(ValueError, match="logging.wandb.mode must be one of online, offline, disabled"):
        _config("logging.wandb.mode=cloud")


def test_overwriting_a_damaged_run_starts_a_new_wandb_run(tmp_path):
    from pretrain.trainer.run_dir import LATEST, plan_resume
    from pretrain.trainer.tracking import read_wandb_state

    (tmp_path / "wandb").mkdir()
    (tmp_path / "wandb" / "run.json").write_text(json.dumps({"id": "old-run", "last_step": 50}))
    (tmp_path / LATEST).write_text("50")  # traces of a run, no intact checkpoint
    plan_resume(tmp_path, overwrite=True)
    assert read_wandb_state(tmp_path) is None
