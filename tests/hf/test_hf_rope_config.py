"""RoPE in exported config.json: both transformers layouts, no warnings, logits equal Megatron's evaluation.

Runtime ~40 s (two tiny in-process trainings, six exports).
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))

from hf_helpers import auto_model, megatron_logits, megatron_model, sample_tokens, transformers_warnings  # noqa: E402
from hf_save_checkpoint import tiny_config, train_and_save  # noqa: E402
from megatron_ext.positions import PositionConfig, build_sampler  # noqa: E402
from pretrain.hf import hf_logits  # noqa: E402
from pretrain.hf.export import export_checkpoint, export_cli  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
WINDOW, EVAL = 32, 96
# kind -> (checkpoint, export keyword arguments, evaluation length)
EXPORTS = {
    "none": ("posaug", {}, EVAL),
    "pi": ("posaug", {"rope_scaling": "pi", "factor": 3.0}, EVAL),
    "ntk": ("posaug", {"rope_scaling": "ntk", "factor": 3.0}, EVAL),
    "dynamic_ntk": ("posaug", {"rope_scaling": "dynamic_ntk", "factor": 2.0}, EVAL),
    "yarn": ("posaug", {"rope_scaling": "yarn", "factor": 4.0}, EVAL),
    "llama3": ("posaug", {"rope_scaling": "llama3", "factor": 4.0}, EVAL),
    "rfs": ("rfs", {}, WINDOW * 8),  # default evaluation length: window × EXTRAPOLATION
}


@pytest.fixture(scope="module")
def exports(megatron_world, tmp_path_factory):
    """{kind: (export dir, checkpoint)} for every shipped scaling, from two tiny trained runs."""
    root = tmp_path_factory.mktemp("rope_exports")
    checkpoints = {"posaug": train_and_save(tiny_config(str(root / "posaug"), groups=2, untied=False)),
                   "rfs": train_and_save(tiny_config(str(root / "rfs"), groups=2, untied=False,
                                                     positions={"strategy": "rfs", "max_position": 100}))}
    out = {}
    for kind, (checkpoint, kwargs, _) in EXPORTS.items():
        export_checkpoint(checkpoints[checkpoint], root / f"hf_{kind}", no_tokenizer=True, **kwargs)
        out[kind] = (root / f"hf_{kind}", checkpoints[checkpoint])
    return out


def megatron_evaluation_logits(checkpoint, kind, tokens):
    """Megatron logits at the run's evaluation positions with the export's scaling applied."""
    model, config = megatron_model(checkpoint)
    positions = config.positions
    if kind != "rfs":
        kwargs = EXPORTS[kind][1]
        positions = PositionConfig(strategy="posaug", rope_scaling=kwargs.get("rope_scaling", "none"),
                                   rope_scaling_factor=kwargs.get("factor"))
    sampler = build_sampler(positions, seed=config.seed, train_seq_len=WINDOW, num_layers=4, rotary_dim=16,
                            rotary_base=10000.0, total_steps=1)
    return megatron_logits(model, tokens, sampler.evaluation(tokens.shape[1]))


@pytest.mark.parametrize("kind", list(EXPORTS))
def test_export_logits_equal_megatron_evaluation_with_the_same_scaling(exports, kind):
    path, checkpoint = exports[kind]
    tokens = sample_tokens(EXPORTS[kind][2], seed=2)
    torch.testing.assert_close(hf_logits(auto_model(path), tokens),
                               megatron_evaluation_logits(checkpoint, kind, tokens), atol=1e-4, rtol=0)


@pytest.mark.parametrize("kind", list(EXPORTS))
def test_export_loads_without_any_transformers_warning(exports, kind):
    with transformers_warnings() as messages:
        auto_model(exports[kind][0])
    assert messages == []


@pytest.mark.parametrize("kind", list(EXPORTS))
def test_export_config_has_the_fields_transformers_4_reads(exports, kind):
    # What transformers 4.45.2 / 4.57.1 read (LlamaConfig.__init__, modeling_rope_utils): a float
    # rope_theta; rope_scaling null or exactly {rope_type, factor} (more keys warn in 4.45), factor a
    # float >= 1; dynamic and (up to 4.50) yarn take the original window from max_position_embeddings.
    # llama3 needs its own original window and frequency factors, and a larger max_position_embeddings.
    config = json.loads((exports[kind][0] / "config.json").read_text())
    assert isinstance(config["rope_theta"], float) and config["head_dim"] == 16
    scaling = config["rope_scaling"]
    if kind == "llama3":
        assert scaling == {"rope_type": "llama3", "factor": 4.0, "original_max_position_embeddings": WINDOW,
                           "low_freq_factor": 1.0, "high_freq_factor": 4.0}
        assert {k: config["rope_parameters"][k] for k in scaling} == scaling
    elif kind in ("none", "ntk"):
        assert scaling is None
        assert config["rope_parameters"] == {"rope_type": "default", "rope_theta": config["rope_theta"]}
    else:
        assert set(scaling) == {"rope_type", "factor"}
        assert isinstance(scaling["factor"], float) and scaling["factor"] >= 1
        assert {k: config["rope_parameters"][k] for k in scaling} == scaling


# What llama.cpp's converter (convert_hf_to_gguf.py, TextModel.__init__ / set_gguf_parameters, LlamaModel's llama3
# rope_freqs) reads: AutoConfig(...).to_dict()'s `rope_parameters`, else `rope_scaling`; from it rope_type (linear /
# yarn / llama3 / default), factor, rope_theta, and yarn's and llama3's original window and llama3's frequency
# factors (llama3 defaults 8192 and 8.0 when absent). dynamic_ntk is refused by export-gguf (pretrain.hf.gguf_support).
GGUF_ROPE = {
    "none": {"rope_type": "default", "rope_theta": 10000.0},
    "pi": {"rope_type": "linear", "factor": 3.0, "rope_theta": 10000.0},
    "ntk": {"rope_type": "default", "rope_theta": 10000.0 * 3.0 ** (16 / 14)},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0, "original_max_position_embeddings": WINDOW},
    "llama3": {"rope_type": "llama3", "factor": 4.0, "rope_theta": 10000.0, "original_max_position_embeddings": WINDOW,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0},
    "rfs": {"rope_type": "linear", "factor": 8 * WINDOW / 100, "rope_theta": 10000.0},
}


@pytest.mark.parametrize("kind", list(GGUF_ROPE))
def test_export_gives_llama_cpps_converter_the_rope_transformers_runs(exports, kind):
    from transformers import AutoConfig

    hparams = AutoConfig.from_pretrained(exports[kind][0]).to_dict()
    read = hparams.get("rope_parameters", hparams.get("rope_scaling")) or {}
    expected = GGUF_ROPE[kind]
    assert read.get("rope_type") == expected["rope_type"]
    assert {key: read.get(key) for key in expected if key != "rope_type"} == \
        pytest.approx({key: value for key, value in expected.items() if key != "rope_type"}, rel=1e-12)


# max_position_embeddings per pretrain.hf.context's table: PosAug serves alpha_max (8) x w, pi/ntk stretch that
# by their factor, RFS its evaluation length; dynamic/yarn keep w (their formula reads it), llama3 its own length.
SERVED = {"none": 8 * WINDOW, "pi": 24 * WINDOW, "ntk": 24 * WINDOW, "dynamic_ntk": WINDOW, "yarn": WINDOW,
          "llama3": 4 * WINDOW, "rfs": 8 * WINDOW}


@pytest.mark.parametrize("kind", list(EXPORTS))
def test_export_announces_the_context_its_method_serves(exports, kind):
    config = json.loads((exports[kind][0] / "config.json").read_text())
    assert config["max_position_embeddings"] == SERVED[kind]
    assert config["posaug_training"]["train_seq_length"] == WINDOW


def test_scalings_that_read_the_window_keep_their_original_window(exports):
    for kind in ("yarn", "llama3"):
        config = json.loads((exports[kind][0] / "config.json").read_text())
        assert config["rope_parameters"]["original_max_position_embeddings"] == WINDOW


def test_lm_eval_default_max_length_is_the_served_context(exports):
    from lm_eval.models.huggingface import HFLM
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel({"a": 0, "<unk>": 1}, unk_token="<unk>")))
    lm = HFLM(pretrained=str(exports["none"][0]), tokenizer=tokenizer, device="cpu", dtype="float32")
    assert lm.max_length == 8 * WINDOW


def test_reimporting_an_export_keeps_the_training_window(exports):
    from pretrain.hf.importer import model_config_from_hf

    config = json.loads((exports["none"][0] / "config.json").read_text())
    assert model_config_from_hf(config).seq_length == WINDOW


def test_max_position_embeddings_flag_overrides_the_rule(exports, tmp_path):
    assert export_cli([exports["none"][1], "--output", str(tmp_path / "hf"), "--no-tokenizer",
                       "--max-position-embeddings", "1000"]) == 0
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["max_position_embeddings"] == 1000


def test_max_position_embeddings_flag_is_refused_where_the_scaling_reads_it(exports, tmp_path, capsys):
    assert export_cli([exports["none"][1], "--output", str(tmp_path / "hf"), "--no-tokenizer",
                       "--rope-scaling", "yarn", "--factor", "4", "--max-position-embeddings", "1000"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--max-position-embeddings cannot be set with RoPE scaling 'yarn'" in err
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("kind", list(EXPORTS))
def test_transformers_4_fields_alone_give_the_same_logits(exports, tmp_path, kind):
    shutil.copytree(exports[kind][0], tmp_path / "legacy")
    config_file = tmp_path / "legacy" / "config.json"
    config = json.loads(config_file.read_text())
    del config["rope_parameters"]
    config_file.write_text(json.dumps(config))
    tokens = sample_tokens(EVAL, seed=4)
    assert torch.equal(hf_logits(auto_model(tmp_path / "legacy"), tokens), hf_logits(auto_model(exports[kind][0]), tokens))


@pytest.mark.skipif(not os.environ.get("POSAUG_TRANSFORMERS4_SITE"),
                    reason="set POSAUG_TRANSFORMERS4_SITE to a site-packages dir with transformers 4.x "
                           "(and its tokenizers/huggingface_hub) to run the exports under 4.x for real")
def test_exports_load_to_the_same_logits_under_transformers_4(exports, tmp_path):
    tokens = sample_tokens(EVAL, seed=5)
    torch.save(tokens, tmp_path / "tokens.pt")
    env = dict(os.environ, 
               PYTHONPATH=os.pathsep.join([os.environ["POSAUG_TRANSFORMERS4_SITE"], str(REPO)]))
    dirs = [str(exports[kind][0]) for kind in EXPORTS]
    proc = subprocess.run([sys.executable, str(REPO / "tests/distributed/hf_load_logits.py"), "--tokens",
                           str(tmp_path / "tokens.pt"), "--out", str(tmp_path / "logits.pt"), *dirs],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert result["version"].startswith("4.")
    logits = torch.load(tmp_path / "logits.pt")
    for kind, directory in zip(EXPORTS, dirs):
        torch.testing.assert_close(logits[directory], hf_logits(auto_model(directory), tokens), atol=1e-5, rtol=0)
        # 4.51+ notes that yarn's original window is taken from max_position_embeddings, as intended.
        assert [m for m in result["warnings"][directory] if "pre-yarn context length, is unset" not in m] == []


def test_export_cli_accepts_the_hf_scaling_names(exports, tmp_path):
    checkpoint = exports["pi"][1]
    assert export_cli([checkpoint, "--output", str(tmp_path / "hf"), "--no-tokenizer",
                       "--rope-scaling", "linear", "--factor", "3"]) == 0
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["rope_scaling"] == {"rope_type": "linear", "factor": 3.0}
    assert config["posaug_training"]["exported_rope_scaling"]["kind"] == "pi"


def test_unknown_rope_scaling_is_refused_naming_the_kinds(exports, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        export_cli([exports["pi"][1], "--output", str(tmp_path / "hf"), "--rope-scaling", "longrope"])
    assert exit_info.value.code == 2
    assert "none, pi, ntk, dynamic_ntk, yarn" in capsys.readouterr().err.replace("'", "")


def test_a_ryarn_run_exports_the_yarn_it_evaluates_with_and_refuses_any_other_scaling():
    # Randomized YaRN evaluates with YaRN at s = L / w (8 here): its export is the posaug + yarn export above, whose
    # logits equal Megatron's evaluation, at that s (tests/positions/test_randomized_yarn.py: the same positions).
    from pretrain.hf.rope import hf_rope_fields, rope_scaling_for

    ryarn = tiny_config("unused", groups=2, untied=False, positions={"strategy": "ryarn", "max_position": 8 * WINDOW})
    posaug = tiny_config("unused", groups=2, untied=False)
    assert rope_scaling_for(ryarn) == rope_scaling_for(posaug, kind="yarn", factor=8.0)
    assert rope_scaling_for(ryarn, kind="yarn", factor=12.0) == rope_scaling_for(posaug, kind="yarn", factor=12.0)
    assert hf_rope_fields(ryarn.model, rope_scaling_for(ryarn))["rope_scaling"] == {"rope_type": "yarn", "factor": 8.0}
    for kwargs, message in (({"kind": "pi", "factor": 8.0}, "--rope-scaling=pi would replace the YaRN"),
                            ({"kind": "yarn", "factor": 4.0}, "--factor must be >= the YaRN factor s = 8"),
                            ({"factor": 8.0}, "--factor needs --rope-scaling yarn")):
        with pytest.raises(ValueError, match=message):
            rope_scaling_for(ryarn, **kwargs)
