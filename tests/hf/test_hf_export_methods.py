"""Exports of the 2025 position options: p-RoPE as transformers' "proportional" RoPE (transformers >= 5.5, refused
in one line before), NoPE-interleaved (+ temperature) as Llama 4 text (transformers >= 4.57); SSMax refused."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from megatron_ext.model import build_model
from pretrain.hf import hf_logits
from pretrain.hf.export import check_exportable, export_checkpoint, export_cli, megatron_to_llama
from pretrain.hf.support import PROPORTIONAL_ROPE_SINCE, check_proportional_rope, rope_types
from pretrain.table import model_preset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

S = 32
HAS_PROPORTIONAL = "proportional" in rope_types()  # transformers >= 5.5
needs_proportional = pytest.mark.skipif(not HAS_PROPORTIONAL, reason="this transformers has no rope_type "
                                        "'proportional' (< 5.5): the refusal tests below run instead")
PROPE = dict(rope_proportion=0.75)
IROPE = dict(no_rope_freq=2, attn_temperature_tuning=True, attn_temperature_beta=0.5, attn_temperature_floor=4)


@pytest.fixture(scope="module")
def trained(megatron_world, tmp_path_factory):
    """Tiny trained checkpoints (2 steps): p-RoPE and NoPE-interleaved with temperature."""
    from hf_save_checkpoint import tiny_config, train_and_save

    root, out = tmp_path_factory.mktemp("methods"), {}
    for name, options in (("prope", PROPE), ("nope_interleave_temperature", IROPE)):
        config = tiny_config(str(root / name), groups=2, untied=False)
        out[name] = train_and_save(dataclasses.replace(config, model=dataclasses.replace(config.model, **options)))
    return out


@needs_proportional
def test_prope_exports_to_llama_proportional_rope_with_equal_logits(megatron_world):
    torch.manual_seed(0)
    config = model_preset("tiny", vocab_size=200, rope_proportion=0.75)
    model = build_model(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():  # spread the weights so a wrong mapping shows
            p.copy_(1.0 + 0.15 * torch.randn_like(p) if "layernorm" in name else 0.15 * torch.randn_like(p))
    hf = megatron_to_llama(model, config)
    assert hf.config.rope_parameters["rope_type"] == "proportional"
    assert hf.config.rope_parameters["partial_rotary_factor"] == 0.75
    tokens = torch.randint(0, 200, (2, S), generator=torch.Generator().manual_seed(5))
    positions = torch.arange(S, dtype=torch.float32)
    with torch.no_grad():
        expected = model(tokens, positions, None)[..., :200]
    torch.testing.assert_close(hf_logits(hf, tokens, positions), expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("options,method", [(dict(no_rope_freq=2), "NoPE-interleaved"),
                                            (dict(ssmax_scale=0.3), "SSMax")])
def test_methods_that_llama_cannot_express_are_refused_in_one_line(options, method):
    with pytest.raises(ValueError, match=f"cannot export: {method}") as error:
        check_exportable(model_preset("tiny", **options))
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("temperature", [False, True], ids=["plain_nope", "with_temperature"])
def test_nope_interleaved_model_exports_to_llama4_text_with_equal_logits(megatron_world, temperature):
    from pretrain.hf.llama4 import megatron_to_llama4

    torch.manual_seed(1)
    config = model_preset("tiny", vocab_size=200, no_rope_freq=2, attn_temperature_tuning=temperature,
                          attn_temperature_beta=0.5, attn_temperature_floor=4)
    model = build_model(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.15 * torch.randn_like(p) if "layernorm" in name else 0.15 * torch.randn_like(p))
    hf = megatron_to_llama4(model, config)
    assert hf.config.no_rope_layers == [1, 0, 1, 0] and hf.config.attn_temperature_tuning is temperature
    assert hf.config.layer_types == ["full_attention"] * 4
    tokens = torch.randint(0, 200, (2, S), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        expected = model(tokens, torch.arange(S, dtype=torch.float32), None)[..., :200]
        cached = hf(tokens, use_cache=True).logits
    torch.testing.assert_close(cached, expected, atol=1e-4, rtol=0)
    torch.testing.assert_close(hf_logits(hf, tokens), expected, atol=1e-4, rtol=0)  # use_cache=False


def test_llama4_export_refuses_ssmax_in_one_line():
    from pretrain.hf.llama4 import llama4_config

    with pytest.raises(ValueError, match="cannot export: SSMax"):
        llama4_config(model_preset("tiny", no_rope_freq=2, ssmax_scale=0.3), 256)


@pytest.mark.parametrize("name", ["prope", "nope_interleave_temperature"])
def test_export_hf_of_a_trained_checkpoint_loads_with_auto_model_and_equal_logits(trained, tmp_path, name):
    from hf_helpers import auto_model, megatron_logits, megatron_model, sample_tokens

    if name == "prope" and not HAS_PROPORTIONAL:
        pytest.skip("this transformers has no rope_type 'proportional' (< 5.5): the refusal tests run instead")
    export_checkpoint(trained[name], tmp_path / "hf", no_tokenizer=True)
    model, _ = megatron_model(trained[name])
    tokens = sample_tokens(32)
    expected = megatron_logits(model, tokens, torch.arange(32, dtype=torch.float32))
    hf = auto_model(tmp_path / "hf")
    torch.testing.assert_close(hf_logits(hf, tokens), expected, atol=1e-4, rtol=0)  # use_cache=False
    with torch.no_grad():
        torch.testing.assert_close(hf(tokens, use_cache=True).logits[..., :expected.shape[-1]], expected,
                                   atol=1e-4, rtol=0)


def test_eval_scores_the_llama4_export_as_the_megatron_checkpoint_it_came_from(trained, tmp_path):
    """transformers 5.x's Llama4ForCausalLM.get_decoder() is the model itself: the scorer takes its body."""
    from pretrain.evaluation.metrics import per_position_loss
    from pretrain.evaluation.scorer_loading import load_scorer

    export_checkpoint(trained["nope_interleave_temperature"], tmp_path / "hf", no_tokenizer=True)
    spans = torch.randint(0, 256, (2, 2 * S), generator=torch.Generator().manual_seed(5))
    hf = load_scorer(tmp_path / "hf", backend="hf", train_window=S)
    megatron = load_scorer(trained["nope_interleave_temperature"], backend="megatron")
    torch.testing.assert_close(per_position_loss(hf, spans), per_position_loss(megatron, spans), atol=2e-5,
                               rtol=1e-5)


def test_the_auto_backend_scores_with_transformers_where_the_checkpoint_exports_else_with_megatron(trained):
    from pretrain.evaluation.scorer_loading import load_scorer

    assert load_scorer(trained["nope_interleave_temperature"]).backend == "megatron"
    assert load_scorer(trained["prope"]).backend == ("hf" if HAS_PROPORTIONAL else "megatron")


def test_the_memory_check_resolves_auto_to_the_backend_load_scorer_picks(trained):
    from pretrain.evaluation.scorer_loading import load_scorer, resolve_backend

    for run in trained.values():
        assert resolve_backend(run, "auto") == load_scorer(run).backend


def test_llama4_export_has_no_chunked_layer_and_a_chunk_size_4_57_accepts(trained, tmp_path):
    """transformers 4.57 builds a chunked mask (needs a size) and sizes chunked cache layers even with null
    chunking: every layer is "full_attention" and the size exceeds any length (pretrain.hf.llama4)."""
    from hf_helpers import read_config

    from pretrain.hf.llama4 import FULL_ATTENTION_CHUNK

    export_checkpoint(trained["nope_interleave_temperature"], tmp_path / "hf", no_tokenizer=True)
    config = read_config(tmp_path / "hf")
    assert config["layer_types"] == ["full_attention"] * config["num_hidden_layers"]
    assert config["attention_chunk_size"] == FULL_ATTENTION_CHUNK >= 2**31 - 1
    assert config["rope_theta"] == config["rope_parameters"]["rope_theta"] == 10000.0  # 4.57 reads rope_theta


def _assert_one_line_refusal(code, capsys):
    assert code == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert "Traceback" not in err and len(errors) == 1 and errors[0].startswith("export-hf: error: "), err
    return errors[0]


def test_prope_export_without_proportional_rope_is_one_line_exit_2_naming_the_version(trained, tmp_path, capsys,
                                                                                     monkeypatch):
    """The installed transformers' own rope-type table, with "proportional" taken out (as in 4.57.1-5.4)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    monkeypatch.delitem(ROPE_INIT_FUNCTIONS, "proportional", raising=False)
    code = export_cli([trained["prope"], "--output", str(tmp_path / "hf"), "--no-tokenizer"])
    line = _assert_one_line_refusal(code, capsys)
    assert "p-RoPE (model.rope_proportion=0.75)" in line and "'proportional'" in line
    assert f"pip install 'transformers>={PROPORTIONAL_ROPE_SINCE}'" in line
    assert not (tmp_path / "hf").exists() and not list(tmp_path.iterdir())


@pytest.mark.skipif(HAS_PROPORTIONAL, reason="this transformers has rope_type 'proportional' (>= 5.5)")
def test_prope_export_under_a_transformers_without_proportional_rope_is_refused(trained, tmp_path):
    """Runs unpatched where the installed transformers is older than 5.5 (e.g. the extra's floor, 4.57.1)."""
    with pytest.raises(ValueError, match=r"pip install 'transformers>=5\.5'"):
        export_checkpoint(trained["prope"], tmp_path / "hf", no_tokenizer=True)


def test_proportional_rope_gate_reads_the_rope_types_it_is_given():
    check_proportional_rope(0.5, available={"default", "proportional"})
    with pytest.raises(ValueError) as error:
        check_proportional_rope(0.5, available={"default", "linear", "dynamic", "yarn", "longrope", "llama3"})
    assert "\n" not in str(error.value) and "cannot export: p-RoPE (model.rope_proportion=0.5)" in str(error.value)
    assert str(error.value).endswith(f"pip install 'transformers>={PROPORTIONAL_ROPE_SINCE}', or score it with "
                                     "--backend megatron")


def test_a_prope_model_picks_the_megatron_backend_where_transformers_lacks_proportional_rope(monkeypatch):
    """check_exportable (the auto-backend test of `reproduce`) refuses p-RoPE then, never a KeyError."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    monkeypatch.delitem(ROPE_INIT_FUNCTIONS, "proportional", raising=False)
    with pytest.raises(ValueError, match="cannot export: p-RoPE"):
        check_exportable(model_preset("tiny", **PROPE))


@pytest.mark.skipif(not os.environ.get("POSAUG_TRANSFORMERS4_SITE"),
                    reason="set POSAUG_TRANSFORMERS4_SITE to a site-packages dir with transformers 4.x "
                           "(and its tokenizers/huggingface_hub) to run these exports under 4.x for real")
def test_under_transformers_4_nope_interleaved_exports_to_equal_logits_and_prope_is_one_line_exit_2(trained,
                                                                                                    tmp_path):
    """`python -m pretrain export-hf` itself under the 4.x site (e.g. 4.57.1, the `hf` extra's floor)."""
    from hf_helpers import megatron_logits, megatron_model, sample_tokens

    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, 
               PYTHONPATH=os.pathsep.join([os.environ["POSAUG_TRANSFORMERS4_SITE"], str(repo)]))

    def run(*args):
        return subprocess.run([sys.executable, *args], env=env, cwd=repo, capture_output=True, text=True,
                              timeout=300)

    refused = run("-m", "pretrain", "export-hf", trained["prope"], "--output",
                  str(tmp_path / "prope"), "--no-tokenizer")
    errors = [line for line in refused.stderr.splitlines() if "error:" in line]
    assert refused.returncode == 2 and "Traceback" not in refused.stderr and len(errors) == 1, refused.stderr[-3000:]
    assert "transformers 4." in errors[0] and f"pip install 'transformers>={PROPORTIONAL_ROPE_SINCE}'" in errors[0]
    assert not (tmp_path / "prope").exists()

    irope = trained["nope_interleave_temperature"]
    exported = run("-m", "pretrain", "export-hf", irope, "--output", str(tmp_path / "irope"),
                   "--no-tokenizer")
    assert exported.returncode == 0, exported.stderr[-3000:]
    tokens = sample_tokens(32)
    torch.save(tokens, tmp_path / "tokens.pt")
    loaded = run(str(repo / "tests/distributed/hf_load_logits.py"), "--tokens", str(tmp_path / "tokens.pt"),
                 "--out", str(tmp_path / "logits.pt"), str(tmp_path / "irope"))  # with the cache (use_cache default)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    result = json.loads(next(line for line in loaded.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert result["version"].startswith("4.")
    model, _ = megatron_model(irope)
    torch.testing.assert_close(torch.load(tmp_path / "logits.pt")[str(tmp_path / "irope")],
                               megatron_logits(model, tokens, torch.arange(32, dtype=torch.float32)),
                               atol=1e-4, rtol=0)


@pytest.fixture(scope="module")
def drope_checkpoint(megatron_world, tmp_path_factory):
    """A tiny DroPE run of 2 steps, the second without RoPE (drope_share 0.5): a recalibrated checkpoint."""
    from hf_save_checkpoint import tiny_config, train_and_save

    config = tiny_config(str(tmp_path_factory.mktemp("drope")), groups=2, untied=False,
                         positions={"strategy": "drope", "drope_share": 0.5})
    return train_and_save(config)


def test_a_recalibrated_drope_model_exports_to_llama4_text_without_rope_in_any_layer_with_equal_logits(
        drope_checkpoint, tmp_path):
    from hf_helpers import auto_model, megatron_logits, megatron_model, read_config, sample_tokens

    export_checkpoint(drope_checkpoint, tmp_path / "hf", no_tokenizer=True)
    config = read_config(tmp_path / "hf")
    assert config["model_type"] == "llama4_text" and config["no_rope_layers"] == [0, 0, 0, 0]
    assert config["attn_temperature_tuning"] is False
    model, _ = megatron_model(drope_checkpoint)
    tokens = sample_tokens(4 * S)  # 4x the window: no position is ever used
    expected = megatron_logits(model, tokens, torch.zeros(4 * S))  # what the trainer and eval run it with
    hf = auto_model(tmp_path / "hf")
    torch.testing.assert_close(hf_logits(hf, tokens), expected, atol=1e-4, rtol=0)
    with torch.no_grad():
        torch.testing.assert_close(hf(tokens, use_cache=True).logits[..., :expected.shape[-1]], expected,
                                   atol=1e-4, rtol=0)


def test_a_recalibrated_drope_model_is_refused_by_export_gguf_in_one_line_before_anything_is_written(
        drope_checkpoint, tmp_path):
    from pretrain.hf.gguf_export import export_gguf

    with pytest.raises(ValueError, match="cannot export to GGUF: no RoPE in any layer .*; use export-hf") as error:
        export_gguf(drope_checkpoint, tmp_path / "gguf")
    assert "\n" not in str(error.value) and not list(tmp_path.iterdir())


def test_a_drope_checkpoint_still_in_pretraining_exports_as_the_rope_model_it_is():
    from megatron_ext.positions import PositionConfig
    from pretrain.hf.export import drope_dropped
    from pretrain.trainer.config import ScheduleConfig, TrainConfig

    config = TrainConfig(model=model_preset("tiny"), positions=PositionConfig(strategy="drope", drope_share=0.5),
                         schedule=ScheduleConfig(train_iters=10))
    assert drope_dropped(config, {"iteration": 5}) is None  # steps 0-4 of 10: RoPE
    assert drope_dropped(config, {"iteration": 6}).no_rope_freq == 1
    qk = dataclasses.replace(config, model=model_preset("tiny", qk_layernorm=True))
    with pytest.raises(ValueError, match="cannot export: a DroPE model with QK-norm") as error:
        drope_dropped(qk, {"iteration": 10})
    assert "\n" not in str(error.value)


def test_eval_names_a_drope_checkpoints_phase_and_scores_it_without_rope_on_both_backends(drope_checkpoint):
    from pretrain.evaluation.metrics import per_position_loss
    from pretrain.evaluation.scorer_loading import load_scorer

    hf, megatron = load_scorer(drope_checkpoint), load_scorer(drope_checkpoint, backend="megatron")
    assert hf.backend == "hf" and hf.info.extra["phase"] == megatron.info.extra["phase"] == "recalibration"
    assert not hf.eval_positions(4 * S).positions.any()
    spans = torch.randint(0, 256, (2, 4 * S), generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(per_position_loss(hf, spans), per_position_loss(megatron, spans), atol=2e-5,
                               rtol=1e-5)
    with pytest.raises(ValueError, match="--rope-scaling yarn scales RoPE, which this DroPE run removes"):
        load_scorer(drope_checkpoint, rope_scaling="yarn", factor=4.0)
