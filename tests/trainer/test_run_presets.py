"""`train CONFIG --preset NAME`: a shipped config shrunk to a CPU run in one flag, its console quiet, and
Transformer Engine on CPU refused at `train --check` in one line."""

import os
import subprocess
import sys

import pytest

from conftest import REPO
from pretrain.trainer import config as config_module
from pretrain.trainer.cli import DEVICE_CHECK_IN_JOB, main
from pretrain.trainer.run_presets import RUN_PRESETS, preset_overrides

SHIPPED = str(REPO / "pretrain" / "configs" / "10m_posaug.yaml")


def resolved(preset, overrides, config=SHIPPED):
    return config_module.load(config, preset_overrides(preset, config, overrides))


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a CUDA machine may run Transformer Engine")
def test_transformer_engine_on_cpu_is_refused_at_check_in_one_line(monkeypatch, capsys):
    monkeypatch.delenv(DEVICE_CHECK_IN_JOB, raising=False)
    assert main(["10m_posaug", "--check", "--set", "data.synthetic=true"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "transformer_impl=transformer_engine needs a CUDA GPU" in err
    assert "model.transformer_impl=local" in err


def test_the_launchers_login_node_preflight_leaves_the_device_check_to_the_job(monkeypatch, capsys):
    monkeypatch.setenv(DEVICE_CHECK_IN_JOB, "1")
    assert main(["10m_posaug", "--check", "--set", "data.synthetic=true"]) == 0


def test_a_preset_sets_local_layers_fp32_its_size_window_budget_and_warmup():
    config = resolved("cpu-small", ["data.synthetic=true"])
    p = RUN_PRESETS["cpu-small"]
    assert (config.model.transformer_impl, config.model.bf16) == ("local", False)
    assert (config.model.hidden_size, config.model.seq_length, config.model.vocab_size) == (128, 64, 4096)
    assert (config.schedule.train_tokens, config.train_iters()) == (p.train_tokens, 800)
    assert (config.optimizer.lr, config.optimizer.lr_warmup_iters) == (3e-3, 40)
    assert config.positions.strategy == "posaug" and config.name == "10m_posaug"


def test_a_preset_takes_the_vocabulary_from_the_datas_tokenizer(tiny_shards):
    assert resolved("cpu-small", [f"data.data_path={tiny_shards}"]).model.vocab_size == 512


def test_a_preset_puts_the_methods_window_fields_at_its_window():
    config = resolved("cpu-small", ["data.synthetic=true"], str(REPO / "pretrain" / "configs" / "113m_rfs.yaml"))
    assert config.positions.max_position == 8 * 64


def test_a_set_given_with_a_preset_wins_over_it():
    assert resolved("cpu-small", ["data.synthetic=true", "optimizer.lr=1e-3"]).optimizer.lr == 1e-3


def test_the_cpu_presets_train_what_reproduces_presets_of_the_same_name_train():
    from pretrain.experiments.presets import PRESETS

    for name, p in RUN_PRESETS.items():
        r = PRESETS[name]
        assert (p.size, p.window, p.train_tokens, p.global_batch_size, p.micro_batch_size, p.lr, p.vocab_size) == \
            (r.model, r.window, r.train_tokens, r.global_batch_size, r.micro_batch_size, r.lr, r.vocab_size), name


@pytest.mark.slow
def test_a_shipped_config_run_on_cpu_with_a_preset_prints_no_warning(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="")
    env.pop("PRETRAIN_SHOW_ALL_WARNINGS", None)
    proc = subprocess.run([sys.executable, "-m", "pretrain", "train", "10m_posaug", "--preset", "cpu-tiny",
                           "--set", "data.synthetic=true", f"checkpoint.save={tmp_path / 'run'}"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    console = proc.stdout + proc.stderr  # the shipped distributed optimizer's fp32 path included
    assert "warning" not in console.lower(), console[-4000:]
    assert (tmp_path / "run" / "latest_checkpointed_iteration.txt").read_text() == "16"


def test_the_readmes_shipped_config_one_liner_resolves_to_a_cpu_run(tiny_shards, capsys):
    [line] = [line for line in (REPO / "README.md").read_text().splitlines()
              if line.startswith("python -m pretrain train 10m_posaug --preset")]
    argv = line.split()[4:]  # after `python -m pretrain train`
    argv[argv.index("--set") + 1] = f"data.data_path={tiny_shards}"  # the README's shards, here the suite's
    assert main([*argv, "--print-config"]) == 0
    printed = capsys.readouterr().out
    assert "transformer_impl: local" in printed and "vocab_size: 512" in printed and "iterations: 800" in printed
