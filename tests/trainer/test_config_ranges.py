"""Every numeric field of every config section has a range (pretrain/trainer/config_ranges.py), nan and inf are
refused everywhere, an empty or non-mapping config file is refused, and `train --check` says so in one line before
any work (the interval 0 that used to be a ZeroDivisionError after step 1, lr nan/inf, an empty file)."""

import dataclasses
import os
import subprocess
import sys

import pytest

from conftest import REPO, TINY_TRAIN, one_error_line
from pretrain.table import SIZES, model_preset
from pretrain.trainer import config as config_module
from pretrain.trainer.config_ranges import RANGES, Range
from pretrain.trainer.config_values import alternatives


def numeric_fields() -> list[tuple[str, str]]:
    """(key, annotation) of every int/float field of every section and the top level."""
    out = [("seed", "int")]
    for section, cls in config_module.SECTIONS.items():
        for spec in dataclasses.fields(cls):
            kinds = alternatives(spec.type)
            if ("int" in kinds or "float" in kinds) and "tuple" not in kinds and "list" not in kinds:
                out.append((f"{section}.{spec.name}", str(spec.type)))
    return out


def outside(bounds: Range, annotation: str) -> str:
    """A value just outside the range, written for --set."""
    step = 1 if "int" in alternatives(annotation) else 0.5
    if bounds.low is not None:
        value = bounds.low if bounds.low_open else bounds.low - step
    else:
        value = bounds.high if bounds.high_open else bounds.high + step
    return str(int(value) if step == 1 else value)


def test_every_numeric_field_of_every_section_has_a_range():
    missing = [key for key, _ in numeric_fields() if key not in RANGES]
    assert not missing, f"give these a Range in pretrain/trainer/config_ranges.py: {missing}"


def test_the_defaults_and_every_model_preset_lie_in_their_ranges():
    config = config_module.TrainConfig()
    for key, _ in numeric_fields():
        section, _, name = key.rpartition(".")
        value = getattr(getattr(config, section) if section else config, name)
        assert value is None or RANGES[key].holds(value), (key, value)
    for size in SIZES:
        model = model_preset(size)
        for key, _ in numeric_fields():
            if key.startswith("model."):
                value = getattr(model, key.split(".")[1])
                assert value is None or RANGES[key].holds(value), (size, key, value)


@pytest.mark.parametrize("key, annotation", numeric_fields())
def test_a_value_outside_its_range_is_refused_naming_the_field(key, annotation):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")) as error:
        config_module.load(None, [f"{key}={outside(RANGES[key], annotation)}"])
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("key, annotation", [(k, a) for k, a in numeric_fields() if "float" in alternatives(a)])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_nan_and_inf_are_refused_for_every_float_field(key, annotation, value):
    with pytest.raises(ValueError, match=f"{key.replace('.', '[.]')} must be a finite number"):
        config_module.load(None, [f"{key}={value}"])


def test_nan_in_a_yaml_file_is_refused(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("optimizer:\n  lr: .nan\n")
    with pytest.raises(ValueError, match="optimizer.lr must be a finite number"):
        config_module.load(path)


def train_check(*overrides: str, config: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="")
    return subprocess.run([sys.executable, "-m", "pretrain", "train", "--check",
                           *(["--config", config] if config else []), "--set", *TINY_TRAIN, "data.synthetic=true",
                           *overrides], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("override, message", [
    ("logging.log_interval=0", "logging.log_interval must be >= 1 (got 0)"),
    ("logging.eval_interval=0", "logging.eval_interval must be >= 1 (got 0)"),
    ("optimizer.lr=nan", "optimizer.lr must be a finite number, got nan"),
    ("optimizer.lr=inf", "optimizer.lr must be a finite number, got inf"),
])
def test_train_check_refuses_a_value_that_would_crash_later_in_one_line(override, message):
    assert message in one_error_line(train_check(override))


@pytest.mark.parametrize("text", ["", "# only a comment\n"])
def test_train_check_refuses_an_empty_config_file(tmp_path, text):
    path = tmp_path / "empty.yaml"
    path.write_text(text)
    line = one_error_line(train_check(config=str(path)))
    assert f"config file {path} is empty" in line


def test_train_check_refuses_a_config_file_that_is_not_a_mapping(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- model\n- schedule\n")
    assert f"config file {path} must hold a mapping of sections" in one_error_line(train_check(config=str(path)))
