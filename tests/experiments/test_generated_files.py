"""Generated files: the shipped configs and SLURM launchers equal what the sizes × methods table produces."""

import re

import pytest
import yaml

from pretrain.experiments.generate import FIND_PROJECT_ROOT, REPO, generated_files
from pretrain.table import METHODS, SHIPPED_METHODS, TABLE1_SIZES

GENERATED = generated_files()


@pytest.mark.parametrize("path", sorted(GENERATED), ids=lambda p: p.name)
def test_checked_in_file_equals_the_generator_output(path):
    assert path.read_text() == GENERATED[path], f"{path}: run `python -m pretrain.experiments.generate`"


def test_every_shipped_config_has_a_launcher_and_nothing_else_is_generated():
    configs = {p.stem for p in GENERATED if p.suffix == ".yaml"}
    launchers = {p.stem.removeprefix("pretrain_") for p in GENERATED if p.suffix == ".sh"}
    assert configs == launchers and len(configs) == len(TABLE1_SIZES) * len(SHIPPED_METHODS) == 105


def test_a_posaug_composition_is_shipped_whenever_the_method_it_composes_is():
    compositions = {name: name.removeprefix("posaug_") for name in METHODS if name.startswith("posaug_")}
    composed = [name for name, part in compositions.items() if part in METHODS]
    # posaug_drope composes PosAug's pretraining with DroPE's switch (a positions strategy, not model fields)
    assert composed == ["posaug_prope", "posaug_irope", "posaug_swa_hybrid", "posaug_qknorm", "posaug_drope"]
    for name in composed:
        assert (name in SHIPPED_METHODS) == (compositions[name] in SHIPPED_METHODS), name


@pytest.mark.parametrize("size", TABLE1_SIZES)
@pytest.mark.parametrize("composition", ["posaug_prope", "posaug_irope", "posaug_swa_hybrid", "posaug_qknorm"])
def test_a_shipped_composition_is_posaugs_positions_with_the_model_fields_of_its_part(size, composition):
    def config(method: str) -> dict:
        return yaml.safe_load((REPO / "pretrain" / "configs" / f"{size}_{method}.yaml").read_text())

    part = composition.removeprefix("posaug_")
    both, posaug, alone, baseline = config(composition), config("posaug"), config(part), config("baseline")
    # PosAug beside sliding-window layers scales the global layers only (positions.layer_mode=global)
    expected = {**posaug["positions"], **({"layer_mode": "global"} if "window_size" in alone["model"] else {})}
    assert both["positions"] == expected and both["positions"]["strategy"] == "posaug"
    assert both["model"] == alone["model"] != baseline["model"]


@pytest.mark.parametrize("size", TABLE1_SIZES)
def test_posaug_drope_is_posaugs_positions_until_drope_drops_them_at_drope_s_share(size):
    def positions(method: str) -> dict:
        return yaml.safe_load((REPO / "pretrain" / "configs" / f"{size}_{method}.yaml").read_text())["positions"]

    posaug, drope, both = positions("posaug"), positions("drope"), positions("posaug_drope")
    assert both == {**posaug, **drope, "drope_pretraining": "posaug"} and both["strategy"] == "drope"
    assert positions("drope_2x")["drope_share"] == 2 * drope["drope_share"]


def test_the_slurm_readme_lists_every_shipped_launcher():
    text = (REPO / "slurm" / "README.md").read_text()
    sizes, methods = re.search(r"`pretrain_\{([\w,]+)\}_\{([\w,]+)\}\.sh`", text).groups()
    assert sizes.split(",") == list(TABLE1_SIZES) and methods.split(",") == list(SHIPPED_METHODS)


@pytest.mark.parametrize("script", ["data_prep.sh", "reproduce_stage.sh"])
def test_the_hand_written_slurm_scripts_find_the_project_root_as_the_launchers_do(script):
    text = (REPO / "slurm" / script).read_text()
    assert FIND_PROJECT_ROOT in text, f"slurm/{script}: paste pretrain/experiments/generate.py's FIND_PROJECT_ROOT"
    assert text.count("POSAUG_ROOT=$(cd") == 1  # and no second copy of its own
