"""The training pool the task suite and the ablations share (pretrain/trainer/run_pool.py), with real trainer
processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from pretrain.trainer.run_pool import train_in_processes


def test_a_failed_run_raises_naming_it_its_config_and_its_log_and_leaves_no_timing(tmp_path):
    def write_config(name: str) -> Path:
        path = tmp_path / f"{name}.yaml"
        path.write_text("model: 5\n")  # refused by the trainer's config check: exit 2
        return path

    started, ended = [], []
    with pytest.raises(RuntimeError) as error:
        train_in_processes(["bad_run"], jobs=1, write_config=write_config, log_dir=tmp_path / "logs",
                           timing_dir=tmp_path / "timing", on_start=lambda name, queued, eta: started.append(name),
                           on_end=lambda name, timing: ended.append(name))
    message = str(error.value)
    assert message.startswith(f"training bad_run failed (exit 2, config {tmp_path / 'bad_run.yaml'}); log "
                              f"{tmp_path / 'logs' / 'bad_run.log'}:")
    assert "error: config section 'model' must be a mapping" in message
    assert started == ["bad_run"] and ended == [] and not list((tmp_path / "timing").iterdir())


def test_the_machine_names_torchs_cpu_kernels_and_version():
    import torch

    from pretrain.trainer.run_pool import machine

    assert f"CPU kernels {torch.backends.cpu.get_cpu_capability()}, torch {torch.__version__}" in machine()
