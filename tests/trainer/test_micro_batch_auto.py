"""schedule.micro_batch_size: auto takes the largest micro-batch `pretrain plan` says fits this rank's memory."""

import pytest

import pretrain.plan.micro_batch  # noqa: F401  registers the planner, as `python -m pretrain` does
from conftest import TINY_TRAIN, run_train
from pretrain.plan.estimate import build_plan
from pretrain.plan.layout import layout_for
from pretrain.trainer import config as config_module
from pretrain.trainer import micro_batch

AUTO = [*TINY_TRAIN, "schedule.global_batch_size=8", "schedule.micro_batch_size=auto", "schedule.train_iters=3",
        "data.synthetic=true"]


def planned_peak(micro: int, dp: int = 1) -> float:
    config = config_module.load(None, [*AUTO, f"schedule.micro_batch_size={micro}"])
    return build_plan(config, layout_for(config, None, None, dp), "h200").worst.peak


def test_auto_takes_the_largest_micro_batch_whose_planned_peak_fits():
    peaks = {m: planned_peak(m) for m in (1, 2, 4, 8)}
    assert peaks[1] < peaks[2] < peaks[4] < peaks[8]
    config = config_module.load(None, AUTO)
    line = micro_batch.resolve(config, 1, memory=((peaks[2] + peaks[4]) // 2, "test budget"))
    assert config.schedule.micro_batch_size == 2
    assert line.startswith("schedule.micro_batch_size=auto: 2 (plan: peak") and "test budget" in line
    config.validate(1)


def test_auto_is_one_microbatch_per_step_when_the_rank_batch_fits():
    config = config_module.load(None, AUTO)
    micro_batch.resolve(config, 2, memory=(2**40, "test budget"))  # DP=2: four samples per rank
    assert config.schedule.micro_batch_size == 4 and config.num_microbatches(2) == 1


def test_auto_refuses_memory_that_holds_not_even_one_sample():
    config = config_module.load(None, AUTO)
    with pytest.raises(ValueError, match="even a micro-batch of 1 is planned at .* add recompute"):
        micro_batch.resolve(config, 1, memory=(int(planned_peak(1)) - 1, "test budget"))


def test_a_micro_batch_that_is_neither_a_number_nor_auto_is_refused():
    with pytest.raises(ValueError, match="schedule.micro_batch_size must be a number >= 1 or auto"):
        config_module.load(None, ["schedule.micro_batch_size=largest"])


@pytest.mark.slow
def test_training_with_auto_logs_the_chosen_micro_batch(tmp_path):
    proc = run_train([*AUTO, f"checkpoint.save={tmp_path}"])
    assert "schedule.micro_batch_size=auto: 8 (plan: peak" in proc.stdout  # the host's RAM holds a tiny batch
    assert "micro-batch 8" in proc.stdout


def test_auto_on_cpu_sizes_against_the_memory_available_now_not_the_hosts_total(tmp_path, monkeypatch):
    peaks = {m: planned_peak(m) for m in (1, 2, 4)}
    free_kib = int((peaks[1] + peaks[2]) / 2) // 1024  # room for a micro-batch of 1, not 2
    (tmp_path / "meminfo").write_text(f"MemTotal:       {1 << 40} kB\nMemAvailable:   {free_kib} kB\n")
    monkeypatch.setattr(micro_batch, "MEMINFO", str(tmp_path / "meminfo"))
    monkeypatch.setattr(micro_batch, "CGROUP", str(tmp_path / "no-cgroup"))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    config = config_module.load(None, AUTO)
    line = micro_batch.resolve(config, 1)
    assert config.schedule.micro_batch_size == 1
    assert "GiB available of" in line and "host memory" in line
