"""Training configuration: shipped presets, token budgets, overrides and validation messages."""

import pytest

from pretrain.experiments.generate import CONFIG_DIR
from pretrain.table import SHIPPED_METHODS, SIZES, TABLE1_SIZES
from pretrain.trainer import config as cfg

TABLE16_STEPS = {"10m": 1907, "42m": 3242, "113m": 8773, "425m": 7629, "1b": 7629}


@pytest.mark.parametrize("size", TABLE1_SIZES)
def test_preset_iterations_match_table16(size):
    config = cfg.load(CONFIG_DIR / f"{size}_posaug.yaml")
    assert config.train_iters() == TABLE16_STEPS[size]
    assert config.tokens_per_iteration() == SIZES[size].global_batch_size * 2048


@pytest.mark.parametrize("size", TABLE1_SIZES)
def test_chinchilla_default_is_20_tokens_per_parameter(size):
    config = cfg.load(CONFIG_DIR / f"{size}_baseline.yaml", ["schedule.train_tokens=null"])
    assert config.train_tokens() == int(20 * config.model.non_embedding_parameters())
    assert config.train_iters() == config.train_tokens() // config.tokens_per_iteration()


def test_chinchilla_budget_of_42m_is_the_papers_850m_tokens():
    config = cfg.load(CONFIG_DIR / "42m_baseline.yaml", ["schedule.train_tokens=null"])
    assert config.train_tokens() == pytest.approx(850e6, rel=0.01)


def test_posaug_config_is_the_papers_default_range():
    config = cfg.load(CONFIG_DIR / "113m_posaug.yaml")
    p = config.positions
    assert (p.strategy, p.alpha_min, p.alpha_max, p.alpha_distribution) == ("posaug", 0.125, 8.0, "uniform")
    assert config.optimizer.clip_grad == 1.0 and config.optimizer.weight_decay == 0.1
    assert (config.optimizer.adam_beta1, config.optimizer.adam_beta2) == (0.9, 0.95)


def test_set_overrides_parse_yaml_scalars_and_numbers_without_a_dot():
    config = cfg.load(None, ["optimizer.lr=3e-4", "data.synthetic=true", "seed=7", "preset=tiny",
                             "model.num_layers=2"])
    assert config.optimizer.lr == 3e-4 and config.data.synthetic and config.seed == 7
    assert config.model.num_layers == 2 and config.model.hidden_size == SIZES["tiny"].architecture["hidden_size"]


def test_resolved_config_round_trips_through_yaml():
    config = cfg.load(CONFIG_DIR / "425m_rfs.yaml")
    again = cfg.from_dict(cfg.yaml.safe_load(cfg.dump(config)))
    assert cfg.to_dict(again) == cfg.to_dict(config)


@pytest.mark.parametrize("overrides,world,message", [
    (["parallel.tensor_model_parallel_size=5"], 5, "must divide model.num_attention_heads"),
    (["parallel.tensor_model_parallel_size=2", "model.num_query_groups=1"], 2, "must divide model.num_query_groups"),
    (["schedule.global_batch_size=10", "schedule.micro_batch_size=4"], 1, "global_batch_size \\(10\\) must be divisible"),
    (["data.synthetic=false"], 1, "data.data_path is missing"),
    (["data.synthetic=false", "data.data_path=/nonexistent/owt"], 1, "no manifest"),
    (["positions.strategy=rpe", "positions.max_position=16"], 1, "positions.max_position"),
    (["parallel.tensor_model_parallel_size=2"], 3, "not divisible by TP×PP×CP"),
    (["schedule.train_iters=5", "optimizer.lr_warmup_iters=5"], 1, "lr_warmup_iters \\(5\\) must be smaller"),
])
def test_invalid_config_fails_validation_with_its_message(overrides, world, message):
    config = cfg.load(None, ["preset=tiny", "data.synthetic=true", *overrides])
    with pytest.raises(ValueError, match=message):
        config.validate(world_size=world)


@pytest.mark.parametrize("overrides,message", [
    (["optimizer.lr=-1"], "optimizer.lr"),
    (["optimizer.lr=abc"], "optimizer.lr must be a number"),
    (["positions.strategy=magic"], "positions.strategy"),
    (["positions.alpha_min=0"], "positions.alpha_min"),
    (["model.bogus=1"], "unknown field"),
    (["nosuchsection.x=1"], "unknown key"),
    (["lr"], "expected key=value"),
    (["preset=huge"], "unknown model preset"),
])
def test_invalid_field_is_rejected_when_loading(overrides, message):
    with pytest.raises(ValueError, match=message):
        cfg.load(None, overrides)


def test_missing_config_file_lists_the_shipped_ones(tmp_path):
    with pytest.raises(ValueError, match="shipped configs are in .*10m_baseline"):
        cfg.load(tmp_path / "nope.yaml")


def test_cli_reports_invalid_config_on_stderr_with_exit_code_2(capsys):
    from pretrain.trainer.cli import main

    assert main(["--set", "preset=tiny", "data.synthetic=false"]) == 2
    assert "data.data_path is missing" in capsys.readouterr().err
