"""A training run on a real full, read-only or vanished disk (issue 23): one `error:` line naming the path, the
space needed against the space free and how to resume, exit code 2, no temporary files left, earlier checkpoints
byte-identical (sha256 before/after), and `python -m pretrain runs` showing the run failed with that reason.

The disks are real tmpfs mounts (the `small_disk` fixture, root as in `make test`). Each test is one or two real
`python -m pretrain train` runs of the tiny preset on synthetic tokens (~5-15 s each on 2 loaded cores).
"""

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from conftest import REPO, TINY_TRAIN, file_hashes, one_error_line, run_train

RUN = [*TINY_TRAIN, "data.synthetic=true", "checkpoint.save_interval=2", "checkpoint.keep_last=5",
       "optimizer.lr_warmup_iters=1"]
pytestmark = pytest.mark.timeout(300)


def train(run_dir, iters, *extra):
    """Train (or resume) the tiny run in `run_dir` up to `iters`; the CompletedProcess, whatever its exit code."""
    return run_train([*RUN, f"schedule.train_iters={iters}", f"checkpoint.save={run_dir}", *extra], check=False)


def runs_line(directory) -> str:
    """`python -m pretrain runs DIR`'s line for the one run under DIR."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "pretrain", "runs", str(directory)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()[1]


def leftovers(directory) -> list[str]:
    """Temporary files a failed write could leave behind."""
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.name.endswith(".tmp")
                  or ".tmp" in p.suffixes)


@pytest.fixture(scope="module")
def two_step_run(tmp_path_factory):
    """A finished 2-step run (one 2.4 MB checkpoint) to continue on a small disk."""
    run_dir = tmp_path_factory.mktemp("two_steps") / "run"
    run_train([*RUN, "schedule.train_iters=2", f"checkpoint.save={run_dir}"])
    return run_dir


@pytest.mark.slow  # trains
def test_full_disk_while_saving_a_checkpoint_is_one_line_exit_2_and_keeps_the_previous_checkpoint(two_step_run,
                                                                                                small_disk):
    disk = small_disk("4m")  # room for one checkpoint, not two
    run_dir = disk.path / "run"
    shutil.copytree(two_step_run, run_dir)
    before = {k: v for k, v in file_hashes(run_dir).items() if k.startswith("iter_0000002/")}

    line = one_error_line(train(run_dir, 4))

    assert f"checkpoint 4 ({run_dir}/iter_0000004): No space left on device" in line
    assert "needs about 2.4 MB, the size of iteration 2's checkpoint" in line and " free)" in line
    assert "removed the partial iter_0000004.tmp" in line and "iter_0000002 is still the newest" in line
    assert "rerun the same command to resume from iteration 2" in line
    assert leftovers(run_dir) == []
    assert {k: v for k, v in file_hashes(run_dir).items() if k.startswith("iter_0000002/")} == before
    assert sorted(p.name for p in run_dir.glob("iter_*")) == ["iter_0000002"]
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "failed" and "No space left on device" in status["error"]
    listed = runs_line(disk.path)
    assert " failed " in listed and "checkpoint 4" in listed and "No space left on device" in listed


@pytest.mark.slow  # trains under torchrun
def test_full_disk_under_two_ranks_is_one_line_and_every_rank_agrees(two_step_run, small_disk):
    disk = small_disk("4m")
    run_dir = disk.path / "run"
    shutil.copytree(two_step_run, run_dir)
    before = {k: v for k, v in file_hashes(run_dir).items() if k.startswith("iter_0000002/")}
    proc = run_train([*RUN, "schedule.train_iters=4", f"checkpoint.save={run_dir}"], nproc=2, check=False)
    # torchrun itself turns a worker's exit 2 into its own exit 1 and failure summary; the workers say one line
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "checkpoint 4" in errors[0] and "No space left on device" in errors[0], proc.stderr
    assert "CheckpointException" not in proc.stderr and "[rank" not in proc.stderr
    assert leftovers(run_dir) == []
    assert {k: v for k, v in file_hashes(run_dir).items() if k.startswith("iter_0000002/")} == before


@pytest.mark.slow  # trains
def test_full_disk_at_the_first_checkpoint_says_the_run_starts_over(small_disk):
    disk = small_disk("2m")  # less than one checkpoint
    line = one_error_line(train(disk.path / "run", 2))
    assert "checkpoint 2" in line and "No space left on device" in line
    assert "size needed unknown: " in line and "written before the failure, removed since; " in line
    assert " free now)" in line and "needs more than" not in line
    assert "no earlier checkpoint exists" in line and "starts from the beginning" in line
    assert leftovers(disk.path / "run") == [] and not list((disk.path / "run").glob("iter_*"))


def test_run_directory_on_a_full_disk_fails_before_training_naming_what_could_not_be_written(small_disk):
    disk = small_disk("1m")
    disk.fill()
    line = one_error_line(train(disk.path / "run", 4))
    assert f"{disk.path}/run/" in line and "No space left on device while writing" in line
    assert "fix: free space in" in line and "checkpoint.save=" in line
    assert leftovers(disk.path) == []


def test_read_only_run_directory_is_one_line_exit_2(two_step_run, small_disk):
    disk = small_disk("8m")
    run_dir = disk.path / "run"
    shutil.copytree(two_step_run, run_dir)
    before = file_hashes(run_dir)
    disk.read_only()
    line = one_error_line(train(run_dir, 4))
    assert f"{run_dir}/" in line and "Read-only file system while writing" in line
    assert f"fix: make {run_dir} writable" in line and "resume from iteration 2" in line
    assert file_hashes(run_dir) == before


@pytest.mark.slow  # trains
def test_full_tensorboard_disk_is_one_line_exit_2_and_recorded_in_status(small_disk, tmp_path):
    disk = small_disk("1m")
    disk.fill(leave=0)
    run_dir = tmp_path / "run"
    line = one_error_line(train(run_dir, 4, f"logging.tensorboard_dir={disk.path / 'tb'}"))
    assert f"TensorBoard events ({disk.path}/tb" in line and "No space left on device" in line
    assert "logging.tensorboard_dir=" in line
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "failed" and "TensorBoard events" in status["error"]
    assert " failed " in runs_line(tmp_path)


def test_read_only_tensorboard_directory_is_one_line_exit_2(small_disk, tmp_path):
    disk = small_disk("1m")
    disk.read_only()
    line = one_error_line(train(tmp_path / "run", 4, f"logging.tensorboard_dir={disk.path / 'tb'}"))
    assert f"TensorBoard events ({disk.path}/tb" in line and "Read-only file system" in line


@pytest.mark.slow  # trains until the directory is removed
def test_run_directory_removed_while_training_is_one_line_exit_2(tmp_path):
    run_dir = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="")
    proc = subprocess.Popen([sys.executable, "-m", "pretrain", "train", "--set", *RUN, "schedule.train_iters=100000",
                             "checkpoint.save_interval=100000", f"checkpoint.save={run_dir}"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        for out in proc.stdout:  # status.json exists from the first step on
            if out.startswith("step 2/") or time.time() > deadline:
                break
        os.rename(run_dir, tmp_path / "gone")  # atomically gone, even while the trainer writes into it
        shutil.rmtree(tmp_path / "gone")
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    line = one_error_line(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr))
    assert str(run_dir) in line and "No such file or directory while writing" in line
    assert "was removed while the command ran" in line
    assert not run_dir.exists(), "a removed run directory is not silently recreated"
