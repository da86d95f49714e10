"""Config mistakes a user makes are refused in one line naming the field (or file and line) and the fix:
wrong types (bool for int, a list, an empty value), YAML errors, a section given twice, a vocabulary
smaller than the data's tokenizer. In-process loads (milliseconds) plus real CLI runs for the exit code."""

import os
import re
import subprocess
import sys

import pytest

from conftest import REPO, TINY_TRAIN, one_error_line
from pretrain.trainer import config as config_module


@pytest.mark.parametrize("override, message", [
    ("model.num_layers=[2]", "model.num_layers must be an integer, got '[2]'"),
    ("model.num_layers=true", "model.num_layers must be an integer, got 'true'"),
    ("model.num_layers=", "model.num_layers must be an integer, got nothing (an empty value)"),
    ("optimizer.lr=fast", "optimizer.lr must be a number, got 'fast'"),
    ("checkpoint.overwrite=1", "checkpoint.overwrite must be true or false, got '1'"),
    ("seed=true", "seed must be an integer, got 'true'"),
])
def test_a_field_of_the_wrong_type_is_refused_naming_it(override, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        config_module.load(None, [override])


def test_an_integer_for_a_float_field_is_a_float():
    assert config_module.load(None, ["optimizer.lr=1"]).optimizer.lr == 1.0


@pytest.mark.parametrize("text, message", [
    ("model:\n  vocab_size: 512\nschedule:\n  train_iters: 4\nmodel:\n  vocab_size: 256\n",
     ":5: 'model' is given twice (first on line 1)"),
    ("model:\n  vocab_size: 512\n  vocab_size: 256\n", ":3: 'vocab_size' is given twice (first on line 2)"),
    ("model:\n  vocab_size: [512\nschedule: {}\n", ":3: expected ',' or ']'"),
    ("model: 5\n", "config section 'model' must be a mapping"),
])
def test_a_broken_yaml_file_is_one_error_naming_file_and_line(tmp_path, text, message):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match="config file" if "section" not in message else "section") as error:
        config_module.load(path)
    assert message in str(error.value) and "\n" not in str(error.value)


def cli_train(*overrides: str, config: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="")
    return subprocess.run([sys.executable, "-m", "pretrain", "train", *(["--config", config] if config else []),
                           "--set", *TINY_TRAIN, *overrides], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)


def test_cli_refuses_a_section_given_twice_with_exit_2(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("model:\n  vocab_size: 512\nmodel:\n  vocab_size: 256\n")
    line = one_error_line(cli_train(f"checkpoint.save={tmp_path / 'run'}", config=str(path)))
    assert f"{path}:3" in line and "'model' is given twice" in line
    assert not (tmp_path / "run").exists()


def test_vocab_smaller_than_the_datas_tokenizer_is_refused_before_the_model_is_built(tiny_shards, tmp_path):
    line = one_error_line(cli_train(f"data.data_path={tiny_shards}", "model.vocab_size=500",
                                    f"checkpoint.save={tmp_path / 'run'}"))
    assert "model.vocab_size is 500" in line and "512-token tokenizer" in line and "model.vocab_size=512" in line
    assert not (tmp_path / "run").exists(), "nothing is written for a refused config"


def test_checkpoint_load_pointing_nowhere_is_refused_before_anything_is_written(tmp_path):
    line = one_error_line(cli_train("data.synthetic=true", f"checkpoint.load={tmp_path / 'nowhere'}",
                                    f"checkpoint.save={tmp_path / 'run'}"))
    assert f"checkpoint.load={tmp_path / 'nowhere'}" in line and "holds no checkpoint" in line
    assert not (tmp_path / "run").exists(), "no config.yaml or .lock for a refused start"


def test_load_equal_to_save_on_an_empty_directory_starts_fresh(tmp_path):
    run = tmp_path / "run"
    proc = cli_train("data.synthetic=true", "schedule.train_iters=2", "optimizer.lr_warmup_iters=0",
                     f"checkpoint.load={run}", f"checkpoint.save={run}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resumed" not in proc.stdout and (run / "latest_checkpointed_iteration.txt").read_text() == "2"
