"""What a user sees: silenced known-harmless warnings (others still shown), progress lines, the trainer's
console (one config line, tok/s and MFU on CPU, an impossible MFU dropped), and the demo ending with its table. ~40 s without slow tests."""

import io
import os
import re
import subprocess
import sys

import pytest

from conftest import REPO, run_train, tensorboard_scalars
from pretrain.console import KNOWN_HARMLESS, Progress

ENV = dict(os.environ, PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="")


def test_known_harmless_warnings_are_silenced_and_any_other_warning_still_shows():
    script = """
import warnings
from pretrain.console import KNOWN_HARMLESS, quiet_known_warnings
quiet_known_warnings()
for known in KNOWN_HARMLESS:
    message = known.message.replace('\\\\', '').replace('.*', ' ... ')
    module = known.module.strip('()').split('|')[0].replace('\\\\', '')
    warnings.warn_explicit(message, known.category, 'x.py', 1, module=module + 'x')
warnings.warn_explicit('Apex is not installed but something new happened', UserWarning, 'x.py', 2,
                       module='megatron.core.models')
warnings.warn_explicit('Transformer Engine and Apex are not installed. Falling back to Torch optimizers.',
                       UserWarning, 'y.py', 3, module='someone_else')
"""
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=ENV, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    shown = [line for line in proc.stderr.splitlines() if "Warning" in line]
    assert len(shown) == 2, proc.stderr  # only the two that are not exactly a known one
    assert "something new happened" in shown[0] and "y.py" in shown[1]


def test_every_silenced_warning_states_its_reason():
    assert all(len(known.reason) > 20 for known in KNOWN_HARMLESS)


def test_known_harmless_log_lines_are_dropped_and_other_lines_of_their_loggers_still_show():
    script = """
import logging
from pretrain.console import KNOWN_HARMLESS_LOG_LINES, quiet_known_warnings
logging.basicConfig(format='%(name)s: %(message)s')
quiet_known_warnings()
for known in KNOWN_HARMLESS_LOG_LINES:
    logging.getLogger(known.logger).warning(known.message.replace('\\\\', '') + ' and more')
    logging.getLogger(known.logger).warning('something new happened')
"""
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=ENV, capture_output=True, text=True,
                          timeout=60)
    from pretrain.console import KNOWN_HARMLESS_LOG_LINES

    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [f"{known.logger}: something new happened" for known in KNOWN_HARMLESS_LOG_LINES]
    assert all(len(known.reason) > 20 for known in KNOWN_HARMLESS_LOG_LINES)


def test_progress_into_a_file_prints_plain_lines_and_no_control_characters():
    out = io.StringIO()
    bar = Progress(4, desc="spans", stream=out, terminal=False, every_s=0.0)
    for _ in range(4):
        bar.update()
    bar.write("an event")
    bar.close()
    lines = out.getvalue().splitlines()
    assert lines[-2].startswith("spans 4/4 (100%)") and lines[-1] == "an event"
    assert "\r" not in out.getvalue() and "\033" not in out.getvalue()


def test_short_loops_print_nothing_into_a_file():
    out = io.StringIO()
    bar = Progress(3, stream=out, terminal=False, every_s=60.0)
    for _ in range(3):
        bar.update()
    assert out.getvalue() == ""


def test_progress_on_a_terminal_redraws_one_line_and_keeps_events_above_it():
    out = io.StringIO()
    bar = Progress(10, desc="train", stream=out, terminal=True)
    bar.update(5, "loss 2.0")
    bar.write("step 5/10 | loss 2.0")
    bar.close()
    text = out.getvalue()
    assert "[##########..........] 5/10 (50%) | loss 2.0 | ETA" in text
    assert "\r\033[Kstep 5/10 | loss 2.0\n" in text


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("console_run")
    proc = run_train(["preset=tiny", "data.synthetic=true", "schedule.train_iters=3", "schedule.global_batch_size=4",
                      "schedule.micro_batch_size=2", "optimizer.lr_warmup_iters=0", "logging.log_interval=1",
                      "positions.strategy=posaug", f"checkpoint.save={run_dir}"])
    return run_dir, proc


def test_training_prints_one_config_line_and_no_yaml_and_no_warnings(tiny_run):
    run_dir, proc = tiny_run
    lines = proc.stdout.splitlines()
    config_lines = [line for line in lines if line.startswith("config: ")]
    assert len(config_lines) == 1 and "size tiny | method posaug" in config_lines[0]
    assert not any(line.startswith(("positions:", "  alpha_min")) for line in lines)
    assert (run_dir / "config.yaml").read_text().count("alpha_min") == 1
    assert "Warning" not in proc.stderr, proc.stderr


def test_tokens_per_second_and_mfu_are_reported_on_cpu(tiny_run):
    run_dir, proc = tiny_run
    steps = [line for line in proc.stdout.splitlines() if line.startswith("step 3/3")]
    assert re.search(r"K tok/s \| .* \| MFU \d", steps[0]), steps
    mfu = tensorboard_scalars(run_dir, "perf/mfu")
    assert len(mfu) == 3 and all(0 < v < 1 for v in mfu.values()), mfu


def test_the_console_says_where_the_cpu_peak_came_from(tiny_run):
    _, proc = tiny_run
    peak_line = next(line for line in proc.stdout.splitlines() if line.startswith("MFU against a peak of"))
    assert re.search(r"\((measured now|cached from \d{4}-\d\d-\d\d \d\d:\d\d UTC): \d+-thread fp32 matmul at the "
                     r"model's shapes, median of \d+ repeats, load average [\d.]+ on \d+ cores\)$", peak_line), peak_line


@pytest.fixture(scope="module")
def impossible_peak_run(tmp_path_factory):
    """A run told that its device peaks at 1 kFLOP/s: every MFU it computes is far above 100 %."""
    run_dir = tmp_path_factory.mktemp("impossible_peak_run")
    proc = run_train(["preset=tiny", "data.synthetic=true", "schedule.train_iters=3", "schedule.global_batch_size=4",
                      "schedule.micro_batch_size=2", "optimizer.lr_warmup_iters=0", "logging.log_interval=1",
                      "logging.peak_tflops=1e-9", f"checkpoint.save={run_dir}"])
    return run_dir, proc


def test_an_impossible_mfu_is_warned_about_once_and_never_printed(impossible_peak_run):
    _, proc = impossible_peak_run
    lines = proc.stdout.splitlines()
    assert any(line.startswith("MFU against a peak of 1e-09 TFLOP/s per device (from the config: logging.peak_tflops)")
               for line in lines), proc.stdout
    warnings = [line for line in lines if "is impossible" in line]
    assert len(warnings) == 1 and "set logging.peak_tflops" in warnings[0], proc.stdout
    steps = [line for line in lines if line.startswith("step ") and "tok/s" in line]
    assert len(steps) == 3 and not any("MFU" in line for line in steps), steps


def test_an_impossible_mfu_reaches_no_scalar_writer(impossible_peak_run):
    run_dir, _ = impossible_peak_run
    assert tensorboard_scalars(run_dir, "perf/mfu") == {}
    assert len(tensorboard_scalars(run_dir, "perf/tokens_per_s")) == 3  # the other scalars are still written


@pytest.mark.e2e
@pytest.mark.slow
def test_demo_sized_run_shows_no_warning_and_ends_with_the_table_and_the_plot_path(tmp_path):
    """~90 s: the demo on the cpu-tiny preset."""
    proc = subprocess.run([sys.executable, "-m", "pretrain", "demo", "--preset", "cpu-tiny", "--output",
                           str(tmp_path)], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Warning" not in proc.stderr, proc.stderr
    lines = proc.stdout.rstrip().splitlines()
    assert lines[-1] == f"per-position loss plot: {tmp_path / 'per_position_loss.png'}"
    assert lines[-5].startswith("| Method |") and [row.split("|")[1].strip() for row in lines[-3:-1]] == [
        "baseline", "posaug"]
    assert sum(line.startswith("config: ") for line in lines) == 2  # one per run, no YAML
