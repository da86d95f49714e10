"""`--set KEY=VALUE` is read by the field's type, not as free YAML: a string field takes the text as it is
(values starting with a YAML special character included), a typed field refuses what it cannot read in one line
naming the key and the type, lists read `[a, b]` or `a,b`, a nested section `{k: v}`. Through real CLI runs
(`train --check`, exit 2) and in-process loads."""

import os
import re
import subprocess
import sys

import pytest

from conftest import REPO, TINY_TRAIN, one_error_line
from pretrain.trainer import config as config_module

SPECIAL_FIRST = ["@", "!", "`", "*", "[", "%", "#", "&"]


def train_check(*overrides: str, config: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="")
    return subprocess.run([sys.executable, "-m", "pretrain", "train", "--check",
                           *(["--config", config] if config else []), "--set", *TINY_TRAIN, *overrides],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("first", [c for c in SPECIAL_FIRST if c != "["])
def test_a_string_field_takes_a_value_starting_with_a_yaml_special_character_as_it_is(first):
    config = config_module.load(None, [f"data.data_path={first}data/owt", f"name={first}run"])
    assert config.data.data_path == f"{first}data/owt" and config.name == f"{first}run"


def test_train_check_names_the_data_prefix_starting_with_at_instead_of_a_traceback():
    line = one_error_line(train_check("data.data_path=@data/owt"))
    assert "'@data/owt'" in line and "no manifest" in line


@pytest.mark.parametrize("first", SPECIAL_FIRST)
def test_a_number_field_given_a_yaml_special_value_is_refused_naming_key_and_type(first):
    with pytest.raises(ValueError, match=re.escape(f"logging.log_interval must be an integer, got '{first}5'")):
        config_module.load(None, [f"logging.log_interval={first}5"])


def test_train_check_refuses_a_number_field_starting_with_hash_instead_of_making_it_null():
    line = one_error_line(train_check("logging.log_interval=#5"))
    assert "logging.log_interval must be an integer, got '#5'" in line


def test_a_list_field_reads_brackets_or_commas_and_types_its_elements():
    assert config_module.load(None, ["positions.alpha_values=[1, 2, 4]"]).positions.alpha_values == (1.0, 2.0, 4.0)
    assert config_module.load(None, ["positions.alpha_values=0.5,2"]).positions.alpha_values == (0.5, 2.0)
    blend = config_module.load(None, ["data.data_path=[0.3, data/a, 0.7, data/b]"]).data.data_path
    assert blend == [0.3, "data/a", 0.7, "data/b"]


@pytest.mark.parametrize("override, message", [
    ("positions.alpha_values=[1, x]", "positions.alpha_values must be a list of numbers, got 'x'"),
    ("positions.alpha_values=[1, 2", "positions.alpha_values must be a list written [a, b, ...]"),
    ("positions.alpha_values=1,,2", "positions.alpha_values: an empty element"),
    ("logging.wandb={project: [", "logging.wandb must be a mapping written {field: value, ...}"),
    ("optimizer.lr=3e-4x", "optimizer.lr must be a number, got '3e-4x'"),
    ("checkpoint.overwrite=maybe", "checkpoint.overwrite must be true or false, got 'maybe'"),
    ("schedule.train_iters=1.5", "schedule.train_iters must be an integer or null, got '1.5'"),
])
def test_an_unreadable_value_is_one_error_naming_the_key_and_the_type(override, message):
    with pytest.raises(ValueError, match=re.escape(message)) as error:
        config_module.load(None, [override])
    assert "\n" not in str(error.value)


def test_null_is_none_only_where_the_field_allows_it():
    assert config_module.load(None, ["schedule.train_iters=null"]).schedule.train_iters is None
    with pytest.raises(ValueError, match=re.escape("model.num_layers must be an integer, got 'null'")):
        config_module.load(None, ["model.num_layers=null"])


def test_numbers_in_exponent_form_fill_an_integer_field_when_whole():
    assert config_module.load(None, ["schedule.train_tokens=2e9"]).schedule.train_tokens == 2_000_000_000


def test_booleans_and_a_nested_mapping_parse():
    config = config_module.load(None, ["data.synthetic=true", "logging.wandb={project: p, mode: offline}"])
    wandb = config.logging.wandb
    assert config.data.synthetic is True and (wandb.project, wandb.mode) == ("p", "offline")


def test_a_number_or_word_field_takes_a_number_as_a_number_and_a_word_as_written():
    from pretrain.trainer.config import load

    assert load(None, ["schedule.micro_batch_size=2"]).schedule.micro_batch_size == 2
    assert load(None, ["schedule.micro_batch_size=auto"]).schedule.micro_batch_size == "auto"
