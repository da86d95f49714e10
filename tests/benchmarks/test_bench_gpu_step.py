"""benchmarks/bench_gpu_step.py: the cpu-tiny dry run end to end, and which variants run in this build."""

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import bench_gpu_step as bench  # noqa: E402
import megatron_record  # noqa: E402

from pretrain.trainer.config import load  # noqa: E402


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """One cpu-tiny run: every variant of the table, one round of one step, one traced step (the suite is short)."""
    output = tmp_path_factory.mktemp("bench")
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_gpu_step.py"), "--preset", "cpu-tiny",
                           "--rounds", "1", "--steps-per-round", "1", "--trace-steps", "1", "--peak-tflops", "1",
                           "--output", str(output)],
                          cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
                               "PATH": "/usr/bin:/bin", **megatron_record.environment()})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return output, json.loads((output / "bench.json").read_text()), proc.stdout


@pytest.mark.slow  # the shared dry run: ~15 CPU-s, 30-50 s on a loaded 2-core machine
def test_dry_run_measures_todays_step(dry_run):
    _, result, _ = dry_run
    today = result["variants"]["today"]
    assert today["tokens_per_s"] > 0 and 0 < today["mfu_causal_once"] < today["mfu"]
    assert today["launches_per_step"] > 0 and "CPU aten ops" in today["launches_counted"]


@pytest.mark.slow  # the shared dry run: ~15 CPU-s, 30-50 s on a loaded 2-core machine
def test_dry_run_counts_the_host_syncs_of_todays_step(dry_run):
    _, result, _ = dry_run
    assert result["variants"]["today"]["host_syncs_per_step"] >= 1


@pytest.mark.slow  # the shared dry run: ~15 CPU-s, 30-50 s on a loaded 2-core machine
def test_every_variant_either_runs_or_says_why_not(dry_run):
    _, result, stdout = dry_run
    for name in [*bench.VARIANTS, bench.ALL_TOGETHER]:
        assert (name in result["variants"]) != (name in result["skipped"]), name
        if name in result["skipped"]:
            assert f"{name}  " in stdout and result["skipped"][name] in stdout


@pytest.mark.slow  # the shared dry run: ~15 CPU-s, 30-50 s on a loaded 2-core machine
def test_dry_run_writes_a_chrome_trace_of_the_traced_steps_per_variant(dry_run):
    output, result, _ = dry_run
    assert result["trace_steps"] == 1
    for row in result["variants"].values():
        trace = json.loads(gzip.decompress((output / row["trace"]).read_bytes()))
        assert trace["traceEvents"]
    assert (output / "table.txt").read_text().startswith("bench_gpu_step cpu-tiny on CPU")


def test_a_switch_missing_from_the_config_is_not_available_in_this_build(monkeypatch):
    monkeypatch.setattr(bench, "VARIANTS", {"today": {}, "absent": {"model.no_such_switch": "true"}})
    runnable, skipped = bench.plan_variants(load(None, ["preset=tiny"]), ["today", "absent"], cuda=False)
    assert list(runnable) == ["today"]
    assert skipped == {"absent": "not available in this build (model.no_such_switch not in the config)"}


def test_a_variant_runs_todays_settings_with_its_switch_on_and_all_together_takes_every_switch(monkeypatch):
    monkeypatch.setattr(bench, "TODAY", {"model.core_attention": "megatron", "model.no_such_switch": "false"})
    monkeypatch.setattr(bench, "VARIANTS", {"today": {}, "sdpa": {"model.core_attention": "sdpa"},
                                            "fp32": {"model.bf16": "false"}})
    runnable, skipped = bench.plan_variants(load(None, ["preset=tiny"]), ["today", "sdpa", bench.ALL_TOGETHER],
                                            cuda=False)
    assert runnable["today"] == ["model.core_attention=megatron"]  # a TODAY switch this build lacks is left out
    assert runnable["sdpa"] == ["model.core_attention=megatron", "model.core_attention=sdpa"]
    assert runnable[bench.ALL_TOGETHER] == ["model.core_attention=megatron", "model.core_attention=sdpa",
                                            "model.bf16=false"]
    assert skipped == {}


def test_a_cuda_only_switch_is_skipped_on_a_cpu(monkeypatch):
    monkeypatch.setattr(bench, "VARIANTS", {"today": {}, "te": {"model.transformer_impl": "transformer_engine"}})
    monkeypatch.setattr(bench, "CUDA_ONLY", {"model.transformer_impl"})
    _, skipped = bench.plan_variants(load(None, ["preset=tiny"]), ["today", "te"], cuda=False)
    assert skipped == {"te": "needs CUDA (model.transformer_impl)"}


def test_an_unknown_variant_is_refused_in_one_line(capsys):
    assert bench.main(["--preset", "cpu-tiny", "--variants", "today", "nonsense", "--output", "/tmp/unused"]) == 2
    assert capsys.readouterr().err.strip().count("\n") == 0
