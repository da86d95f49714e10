"""Generated files: the shipped configs and SLURM launchers equal what the sizes × methods table produces."""

import pytest

from pretrain.experiments.generate import FIND_PROJECT_ROOT, REPO, generated_files
from pretrain.table import SHIPPED_METHODS, TABLE1_SIZES

GENERATED = generated_files()


@pytest.mark.parametrize("path", sorted(GENERATED), ids=lambda p: p.name)
def test_checked_in_file_equals_the_generator_output(path):
    assert path.read_text() == GENERATED[path], f"{path}: run `python -m pretrain.experiments.generate`"


def test_every_shipped_config_has_a_launcher_and_nothing_else_is_generated():
    configs = {p.stem for p in GENERATED if p.suffix == ".yaml"}
    launchers = {p.stem.removeprefix("pretrain_") for p in GENERATED if p.suffix == ".sh"}
    assert configs == launchers and len(configs) == len(TABLE1_SIZES) * len(SHIPPED_METHODS) == 45


@pytest.mark.parametrize("script", ["data_prep.sh", "reproduce_stage.sh"])
def test_the_hand_written_slurm_scripts_find_the_project_root_as_the_launchers_do(script):
    text = (REPO / "slurm" / script).read_text()
    assert FIND_PROJECT_ROOT in text, f"slurm/{script}: paste pretrain/experiments/generate.py's FIND_PROJECT_ROOT"
    assert text.count("POSAUG_ROOT=$(cd") == 1  # and no second copy of its own
