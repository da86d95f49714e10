"""A resume accepts a changed setting that shapes no checkpointed tensor (dropout, the init std) and refuses
one that does (num_layers), naming it. The check reads the run directory's train_state.json as `train` does."""

import json

import pytest

from pretrain.trainer import config as config_module
from pretrain.trainer.resume_check import check_model_unchanged
from pretrain.trainer.run_dir import CheckpointError


def run_with_checkpoint(tmp_path, *overrides):
    """A run directory whose checkpoint records the tiny model, and the config that resumes it with `overrides`."""
    base = ["preset=tiny", f"checkpoint.save={tmp_path}"]
    (tmp_path / "iter_0000002").mkdir()
    recorded = config_module.to_dict(config_module.load(None, base))
    (tmp_path / "iter_0000002" / "train_state.json").write_text(json.dumps({"iteration": 2, "config": recorded}))
    return config_module.load(None, [*base, *overrides])


@pytest.mark.parametrize("change", ["model.hidden_dropout=0.1", "model.attention_dropout=0.1",
                                    "model.init_method_std=0.01", "model.bf16=true"])
def test_a_change_that_shapes_no_checkpointed_tensor_is_accepted(tmp_path, change):
    check_model_unchanged(run_with_checkpoint(tmp_path, change))


def test_a_change_of_the_models_shape_is_refused_naming_the_field(tmp_path):
    with pytest.raises(CheckpointError, match="model.num_layers"):
        check_model_unchanged(run_with_checkpoint(tmp_path, "model.num_layers=3"))
