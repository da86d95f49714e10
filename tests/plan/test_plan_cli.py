"""`python -m pretrain plan`: the table, --json, --check, --sweep, the SLURM time warning, bad input."""

import json
import re

import pytest

from pretrain.plan.cli import main
from pretrain.plan.hardware import GPUS
from pretrain.plan.report import parse_slurm_time
from pretrain.trainer.peak import PEAK_TFLOPS


def test_table_shows_parameters_bytes_peak_and_gpu_hours(capsys, megatron_world):
    assert main(["113m_posaug", "--gpu", "a100-80gb"]) == 0
    out = capsys.readouterr().out
    for expected in ("113,265,408", "optimizer state", "activations", "logits + loss",
                     "CUDA ctx/NCCL", "peak", "headroom", "FLOPs per token", "tokens           2,300,000,000",
                     "assumed MFU      33% of 312 TFLOP/s", "GPU-hours"):
        assert expected in out


def test_json_has_the_peak_and_the_cost(capsys, megatron_world):
    assert main(["42m_baseline", "--json", "--nodes", "1", "--gpus-per-node", "2"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["layout"]["dp"] == 2 and plan["fits"] is True
    assert plan["peak"] == plan["stages"][0]["peak"] > plan["stages"][0]["weights"]
    assert plan["gpu_hours"] == pytest.approx(plan["wall_seconds"] * 2 / 3600)


def test_step_time_follows_from_flops_and_the_assumed_mfu(capsys, megatron_world):
    assert main(["10m_posaug", "--json", "--mfu", "0.25", "--nodes", "1", "--gpus-per-node", "1"]) == 0
    plan = json.loads(capsys.readouterr().out)
    expected = plan["tokens_per_step"] * plan["flops_per_token"] / (989e12 * 0.25)
    assert plan["step_seconds"] == pytest.approx(expected)
    assert plan["mfu_source"] == "--mfu"


def test_check_refuses_a_peak_over_the_gpu_memory_in_one_line_naming_the_setting(capsys, megatron_world):
    code = main(["1b_posaug", "--gpu", "a100-40gb", "--nodes", "1", "--gpus-per-node", "1",
                 "--micro-batch", "32", "--check"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and "exceeds" in err and "--micro-batch" in err


def test_recompute_and_more_tensor_parallelism_make_it_fit(capsys, megatron_world):
    assert main(["1b_posaug", "--gpu", "a100-40gb", "--nodes", "1", "--gpus-per-node", "2", "--tp", "2",
                 "--sequence-parallel", "--micro-batch", "16", "--recompute", "full", "--check"]) == 0


def test_time_limit_shorter_than_the_run_warns_about_requeue(capsys, megatron_world):
    assert main(["113m_posaug", "--mfu", "0.01", "--slurm-time", "1:00:00", "--usr1-lead", "300"]) == 0
    assert "relies on requeue" in capsys.readouterr().out


def test_layout_that_does_not_divide_the_batch_is_bad_input(capsys, megatron_world):
    assert main(["113m_posaug", "--nodes", "1", "--gpus-per-node", "3"]) == 2
    assert "schedule.global_batch_size (128) must be divisible" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["113m_ssmax", "113m_irope"])
def test_context_parallelism_for_a_model_that_scales_queries_by_index_is_bad_input(capsys, megatron_world, name):
    assert main([name, "--set", "parallel.context_parallel_size=2", "--nodes", "1", "--gpus-per-node", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "set parallel.context_parallel_size=1" in err


def test_fp8_on_a_gpu_without_fp8_is_bad_input(capsys, megatron_world):
    assert main(["10m_posaug", "--gpu", "a100-80gb", "--precision", "fp8"]) == 2
    assert "--precision bf16" in capsys.readouterr().err


def test_sweep_lists_every_size_and_method_with_a_total(capsys, megatron_world):
    assert main(["--sweep", "--gpu", "h200", "--mfu", "0.3"]) == 0
    out = capsys.readouterr().out
    assert "1b_warp" in out and "10m_baseline" in out and out.count("\n") >= 27
    assert "total" in out


def test_sweep_has_one_aligned_row_per_size_and_shipped_method(capsys, megatron_world):
    from pretrain.table import SHIPPED_METHODS, TABLE1_SIZES

    assert main(["--sweep"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if line.startswith("run "))
    rows = {line.split()[0]: line for line in lines if re.match(r"^\S+\s+\d+\s+\d+/\d+/\d+ ", line)}
    assert list(rows) == [f"{size}_{method}" for size in TABLE1_SIZES for method in SHIPPED_METHODS]
    assert {len(row) for row in rows.values()} == {len(header)}  # every column under its heading


@pytest.mark.parametrize("text,seconds", [("30", 1800), ("1:30", 90), ("48:00:00", 172800),
                                          ("2-00:00:00", 172800), ("1-12", 129600)])
def test_slurm_time_formats(text, seconds):
    assert parse_slurm_time(text) == seconds


def test_bf16_peaks_equal_the_trainers_mfu_table():
    for gpu in GPUS.values():
        if gpu.family:
            assert PEAK_TFLOPS[gpu.family] == gpu.bf16_tflops
