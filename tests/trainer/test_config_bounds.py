"""A config is read within bounds: an alias bomb, a structure nested too deep, an oversized file and a nested
`data.data_path` are refused in one line within seconds and under a memory cap, at `--print-config` and
`train --check` (the launchers' login-node pre-flight); a rejected value is shown cut short; the same bounds hold for
`--set` mappings and an imported Hugging Face config.json."""

import json
import resource
import subprocess
import sys
import time

import pytest

from conftest import REPO, one_error_line
from pretrain.trainer import config as config_module
from pretrain.trainer.config_values import MAX_NESTING, read_json

MEMORY_CAP = 2 << 30  # the refused configs would grow past 6 GiB


def bomb(levels: int = 9) -> str:
    """A 'billion laughs': `levels` levels of 9 aliases each (9**levels leaves in a few hundred bytes)."""
    lines = ['a0: &a0 ["lol"]']
    for level in range(1, levels):
        lines.append(f"a{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def _capped():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def run_capped(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pretrain", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, preexec_fn=_capped)


def config_with(tmp_path, section_text: str) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(section_text)
    return str(path)


@pytest.mark.parametrize("where", ["name", "model.num_layers", "data.data_path", "logging.wandb.project", "section"])
@pytest.mark.parametrize("command", [["train", "--print-config"], ["train", "--check"]])
def test_an_alias_bomb_is_refused_in_seconds_under_a_memory_cap(tmp_path, where, command):
    anchors = bomb()
    value = "*a8"
    body = {"name": f"name: {value}\n", "model.num_layers": f"model:\n  num_layers: {value}\n",
            "data.data_path": f"data:\n  data_path: {value}\n",
            "logging.wandb.project": f"logging:\n  wandb:\n    project: {value}\n",
            "section": f"model: {value}\n"}[where]
    path = config_with(tmp_path, "x_anchors:\n" + "".join(f"  {line}\n" for line in anchors.splitlines()) + body)
    started = time.monotonic()
    proc = run_capped(command[0], path, command[1], "--set", "data.synthetic=true")
    line = one_error_line(proc)
    assert "aliases" in line and "write the values out" in line and len(line) < 400
    assert time.monotonic() - started < 60


def test_a_structure_nested_deeper_than_the_bound_is_one_line(tmp_path):
    path = config_with(tmp_path, "model: " + "[" * 1500 + "]" * 1500 + "\n")
    line = one_error_line(run_capped("train", path, "--print-config"))
    assert f"nested deeper than {MAX_NESTING} levels" in line


def test_an_oversized_config_file_is_refused_naming_its_size(tmp_path):
    path = config_with(tmp_path, "# padding\n" * 200_000)
    with pytest.raises(ValueError, match="more than a config's"):
        config_module.load(path)


def test_a_rejected_value_is_shown_cut_short():
    with pytest.raises(ValueError) as refused:
        config_module.load(None, ["model.num_layers=" + "9" * 5000 + "x"])
    assert len(str(refused.value)) < 400


def test_a_nested_data_path_is_refused_as_not_flat(tmp_path):
    path = config_with(tmp_path, "data:\n  data_path: [[0.5, a], [0.5, b]]\n")
    with pytest.raises(ValueError, match="flat list"):
        config_module.load(path)


def test_a_set_mapping_with_multiplying_aliases_is_refused():
    inner = "{a: &a [x, x, x, x, x, x, x, x, x, x], " + ", ".join(
        f"b{i}: &b{i} [" + ", ".join([f"*{'a' if i == 0 else f'b{i - 1}'}"] * 10) + "]" for i in range(6)) + "}"
    with pytest.raises(ValueError, match="aliases"):
        config_module.load(None, [f"logging.wandb={inner}"])


def test_an_hf_config_json_nested_too_deep_is_one_line(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match="nested"):
        read_json(path, "Hugging Face config")
    nested: list = [1]
    for _ in range(MAX_NESTING + 1):
        nested = [nested]
    path.write_text(json.dumps({"a": nested}))
    with pytest.raises(ValueError, match="nested deeper"):
        read_json(path, "Hugging Face config")


@pytest.mark.parametrize("field", ["name", "checkpoint.save"])
def test_a_run_directory_name_longer_than_a_filesystem_allows_is_one_line(tmp_path, field):
    value = "n" * 300 if field == "name" else str(tmp_path / ("d" * 300))
    proc = subprocess.run([sys.executable, "-m", "pretrain", "train", "--set", "preset=tiny", "data.synthetic=true",
                           "schedule.train_iters=1", f"{field}={value}"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    line = one_error_line(proc)
    assert "300 bytes" in line and f"shorten {field}" in line and len(line) < 400
