"""Every `eval run` mode that grows with length has its memory estimated before a weight is read (passkey,
needle, context gain, attention entropy), for the scorer backend "auto" will pick: an SSMax run is scored by the
Megatron model, whose L x L attention needs ~1,200 GiB at 200K tokens where transformers needs ~1 GiB. Refusals
are one line naming the flag (exit 2). Real `python -m pretrain eval run` processes on a tiny trained SSMax run;
the data path does not exist, so a check that fails to refuse ends at the data, never in a huge allocation."""

import os
import subprocess
import sys

import pytest

from conftest import REPO, run_train

TRAIN = ["preset=tiny", "model.vocab_size=512", "schedule.global_batch_size=8", "schedule.micro_batch_size=2",
         "optimizer.lr_warmup_iters=0", "logging.eval_interval=100", "data.synthetic=true", "schedule.train_iters=2",
         "checkpoint.save_interval=2"]


@pytest.fixture(scope="module")
def ssmax_run(tmp_path_factory):
    """A 2-step tiny run with SSMax, which the HF Llama export cannot express: "auto" scores it with Megatron."""
    run = tmp_path_factory.mktemp("ssmax") / "run"
    run_train([*TRAIN, "model.ssmax_scale=0.4", f"checkpoint.save={run}"])
    return run


def eval_run(run, tmp_path, *flags):
    env = dict(os.environ, PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-m", "pretrain", "eval", "run", str(run), "--data",
                           str(tmp_path / "no_data"), "--out", str(tmp_path / "out"), "--no-progress", *flags],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and len(errors) == 1, proc.stderr[-3000:]
    return errors[0]


@pytest.mark.parametrize("flag, value", [("--passkey-lengths", "10000000"),
                                         pytest.param("--ruler-lengths", "10000000", marks=pytest.mark.slow),
                                         pytest.param("--context-gain", "10000000", marks=pytest.mark.slow)])
def test_a_length_growing_mode_that_cannot_fit_is_refused_naming_its_flag(ssmax_run, tmp_path, flag, value):
    line = eval_run(ssmax_run, tmp_path, flag, value)
    assert line.startswith(f"error: {flag} {value} needs about") and "largest length that fits" in line, line
    assert f"(lower {flag}" in line, line


def test_auto_estimates_the_megatron_scorer_it_picks_for_an_ssmax_run(ssmax_run, tmp_path):
    line = eval_run(ssmax_run, tmp_path, "--lengths", "200000")
    assert line.startswith("error: --lengths 200000 needs about 1193.") and "megatron backend" in line, line


def test_the_entropy_of_a_length_that_fits_for_losses_is_refused_naming_entropy_spans(ssmax_run, tmp_path):
    from pretrain.evaluation.memory import available_bytes, entropy_bytes, largest_length, model_shape, peak_bytes

    shape, budget = model_shape(ssmax_run), available_bytes("cpu")
    length = int(0.7 * largest_length(lambda n: peak_bytes(shape, n, 1, 1, "megatron"), budget))
    assert entropy_bytes(shape, length, 1, "megatron") > 1.2 * budget  # away from the edge: the budget moves
    line = eval_run(ssmax_run, tmp_path, "--lengths", str(length), "--num-spans", "1", "--entropy-spans", "1")
    assert line.startswith(f"error: --lengths {length} needs about") and "--entropy-spans" in line, line


def test_eval_all_refuses_a_run_whose_estimate_cannot_fit_before_reading_it(ssmax_run, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-m", "pretrain", "eval", "all", str(ssmax_run.parent), "--data",
                           str(tmp_path / "no_data"), "--lengths", "200000", "--out", str(tmp_path / "out"),
                           "--no-progress"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr[-3000:]
    assert "run: not evaluated: --lengths 200000 needs about 1193." in proc.stdout, proc.stdout
    assert "megatron backend" in proc.stdout, proc.stdout
