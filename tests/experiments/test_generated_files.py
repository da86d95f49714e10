"""Generated files: the shipped configs and SLURM launchers equal what the sizes × methods table produces."""

import pytest

from pretrain.experiments.generate import generated_files
from pretrain.table import SHIPPED_METHODS, TABLE1_SIZES

GENERATED = generated_files()


@pytest.mark.parametrize("path", sorted(GENERATED), ids=lambda p: p.name)
def test_checked_in_file_equals_the_generator_output(path):
    assert path.read_text() == GENERATED[path], f"{path}: run `python -m pretrain.experiments.generate`"


def test_every_shipped_config_has_a_launcher_and_nothing_else_is_generated():
    configs = {p.stem for p in GENERATED if p.suffix == ".yaml"}
    launchers = {p.stem.removeprefix("pretrain_") for p in GENERATED if p.suffix == ".sh"}
    assert configs == launchers and len(configs) == len(TABLE1_SIZES) * len(SHIPPED_METHODS) == 45
