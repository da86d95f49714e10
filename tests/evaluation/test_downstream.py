"""`eval downstream`: real lm-evaluation-harness on a tiny Megatron checkpoint and its HF export,
with local task YAML files (a HellaSwag-shaped multiple-choice task and a perplexity task)."""

import json
import re
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from downstream_helpers import (MC_DOCS, MC_TASK, PPL_DOCS, PPL_TASK, make_finished_run, offline_env,  # noqa: E402
                                write_broken_task, write_tasks)

pytest.importorskip("lm_eval", reason="the eval extra (lm-eval) is not installed")

from pretrain.evaluation import eval_cli  # noqa: E402
from pretrain.evaluation.downstream import evaluate_downstream, hf_model_dir  # noqa: E402

pytestmark = [pytest.mark.slow]  # lm-eval import and runs, ~1 min in all


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    with pytest.MonkeyPatch.context() as monkeypatch:
        offline_env(monkeypatch, tmp_path_factory.mktemp("datasets_cache"))
        yield


@pytest.fixture(scope="module")
def tasks(env, tmp_path_factory):
    return write_tasks(tmp_path_factory.mktemp("tasks"))


@pytest.fixture(scope="module")
def run(megatron_world, tiny_shards, tmp_path_factory):
    """A finished PosAug run whose data manifest names its SentencePiece tokenizer."""
    return make_finished_run(tmp_path_factory.mktemp("runs") / "posaug_s1", tiny_shards, "posaug")


@pytest.fixture(scope="module")
def export(run, tmp_path_factory):
    from pretrain.hf.export import export_checkpoint

    return export_checkpoint(run, tmp_path_factory.mktemp("export") / "hf")


def _stock_lm_eval(model_dir, task, tasks_dir, **kwargs):
    """lm-eval exactly as a user would call it on an HF directory (its own `hf` model class)."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    return lm_eval.simple_evaluate(model="hf", model_args={"pretrained": str(model_dir), "dtype": "float32"},
                                   tasks=[task], device="cpu", batch_size=8,  # our default
                                   task_manager=TaskManager(include_path=str(tasks_dir), include_defaults=False),
                                   **kwargs)


def test_checkpoint_and_its_hf_export_give_identical_acc_and_acc_norm(run, export, tasks, tmp_path, capsys):
    assert eval_cli(["downstream", str(run), "--tasks", MC_TASK, "--include-path", str(tasks),
                     "--output", str(tmp_path)]) == 0
    (written,) = tmp_path.glob("lm_eval_*.json")
    ours = json.loads(written.read_text())["results"][MC_TASK]
    theirs = _stock_lm_eval(export, MC_TASK, tasks)["results"][MC_TASK]
    for metric in ("acc,none", "acc_norm,none", "acc_stderr,none", "acc_norm_stderr,none"):
        assert ours[metric] == theirs[metric], metric
    assert ours["sample_len"] == len(MC_DOCS)


def test_console_ends_with_lm_evals_own_table_of_the_written_results(run, tasks, tmp_path, capsys):
    from lm_eval.utils import make_table

    assert eval_cli(["downstream", str(run), "--tasks", f"{MC_TASK},{PPL_TASK}", "--include-path", str(tasks),
                     "--output", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    (written,) = tmp_path.glob("lm_eval_*.json")
    results = json.loads(written.read_text())
    assert out.endswith(make_table(results))
    assert f"wrote {written}" in out
    assert set(results["results"]) == {MC_TASK, PPL_TASK}
    assert results["pretrain"]["iteration"] == 2 and results["pretrain"]["kind"] == "megatron"


def _our_logprob(scorer, ids: list[int], first: int) -> float:
    """Sum of log p(ids[i] | ids[:i]) for i >= first, by our Megatron scorer."""
    losses = scorer.token_losses(torch.tensor([ids]))[0]
    return -float(losses[first - 1:].double().sum())


def test_harness_loglikelihood_equals_our_scorers_sum_of_token_logprobs(run, export, tasks, tmp_path):
    from transformers import AutoTokenizer

    from pretrain.evaluation.scorer_loading import load_scorer

    results, _ = evaluate_downstream(run, [MC_TASK], limit=1, include_path=str(tasks), log_samples=True,
                                     out=tmp_path)
    sample = results["samples"][MC_TASK][0]
    scorer = load_scorer(run, backend="megatron")  # Megatron's own forward, not the HF model lm-eval ran
    tokenizer = AutoTokenizer.from_pretrained(export)
    for (context, continuation), ((harness, _),) in zip(sample["arguments"], sample["resps"]):
        assert context == MC_DOCS[0]["ctx"] and continuation.startswith(" ")
        whole = tokenizer(context + continuation, add_special_tokens=False)["input_ids"]
        prefix = tokenizer(context, add_special_tokens=False)["input_ids"]
        assert whole[:len(prefix)] == prefix
        assert harness == pytest.approx(_our_logprob(scorer, whole, len(prefix)), abs=2e-4)


def test_rolling_perplexity_equals_our_scorers_word_perplexity(run, export, tasks, tmp_path):
    from transformers import AutoTokenizer

    from pretrain.evaluation.scorer_loading import load_scorer

    results, _ = evaluate_downstream(run, [PPL_TASK], include_path=str(tasks), out=tmp_path)
    scorer = load_scorer(run, backend="megatron")
    tokenizer = AutoTokenizer.from_pretrained(export)
    total, words = 0.0, 0
    for doc in PPL_DOCS:
        ids = tokenizer(doc["text"], add_special_tokens=False)["input_ids"]
        assert len(ids) < 32  # one window of the tiny model
        prefix = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
        total += _our_logprob(scorer, [prefix, *ids], 1)  # the harness predicts the first token from BOS
        words += len(re.split(r"\s+", doc["text"]))
    expected = float(torch.tensor(-total / words).exp())
    assert results["results"][PPL_TASK]["word_perplexity,none"] == pytest.approx(expected, rel=1e-4)


@pytest.mark.parametrize("dataset_path,data_files", [("json", "/nonexistent/dir/mc.jsonl"),
                                                     ("no-such-org/no-such-dataset", None)])
def test_a_dataset_that_cannot_be_had_is_one_line_naming_the_task_and_exit_2(run, env, tmp_path, capsys,
                                                                               dataset_path, data_files):
    include = write_broken_task(tmp_path / "tasks", "broken_task", dataset_path, data_files)
    assert eval_cli(["downstream", str(run), "--tasks", "broken_task", "--include-path", str(include),
                     "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: task broken_task: its dataset could not be loaded") and err.count("\n") == 1
    assert "--include-path" in err and not list(tmp_path.glob("out/*.json"))


def test_an_unknown_task_is_one_line_and_exit_2(run, tasks, capsys):
    assert eval_cli(["downstream", str(run), "--tasks", f"{MC_TASK},hellaswagg", "--include-path", str(tasks)]) == 2
    err = capsys.readouterr().err
    assert "unknown lm-eval task(s) hellaswagg" in err and err.count("\n") == 1


def test_without_lm_eval_the_command_names_the_extra_to_install(run, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # as if not installed
    assert eval_cli(["downstream", str(run), "--tasks", MC_TASK]) == 2
    assert "pip install 'posaug-megatron[eval]'" in capsys.readouterr().err


def test_rope_scaling_on_an_hf_directory_writes_the_exports_config_fields(run, export, tmp_path):
    from pretrain.hf.export import export_checkpoint

    with hf_model_dir(export, rope_scaling="yarn", factor=4.0) as (scaled, _):
        fields = json.loads((scaled / "config.json").read_text())
        assert (scaled / "model.safetensors").resolve() == (export / "model.safetensors").resolve()
    assert not scaled.exists()  # the temporary copy is gone, the export untouched
    expected = json.loads((export_checkpoint(run, tmp_path / "yarn", rope_scaling="yarn", factor=4.0)
                           / "config.json").read_text())
    for key in ("rope_scaling", "rope_parameters", "rope_theta", "max_position_embeddings"):
        assert fields[key] == expected[key], key
    assert json.loads((export / "config.json").read_text())["rope_scaling"] is None


def test_rope_scaling_on_a_checkpoint_defaults_its_factor_to_context_length_over_window(run):
    with hf_model_dir(run, rope_scaling="pi", context_length=128) as (model_dir, info):
        assert info["rope_scaling"] == {"rope_type": "linear", "factor": 4.0}  # 128 / w=32
    with pytest.raises(ValueError, match="needs --factor F or --context-length"):
        with hf_model_dir(run, rope_scaling="pi"):
            pass


def test_an_hf_directory_with_rope_scaling_scores_like_the_export_made_with_it(run, export, tasks, tmp_path):
    from pretrain.hf.export import export_checkpoint

    def loglikelihoods(results):
        return [[resp[0][0] for resp in s["resps"]] for s in results["samples"][MC_TASK]]

    scaled, _ = evaluate_downstream(export, [MC_TASK], rope_scaling="yarn", factor=4.0, include_path=str(tasks),
                                    log_samples=True, out=tmp_path / "out")
    yarn_export = export_checkpoint(run, tmp_path / "yarn", rope_scaling="yarn", factor=4.0)
    assert loglikelihoods(scaled) == loglikelihoods(_stock_lm_eval(yarn_export, MC_TASK, tasks, log_samples=True))
    plain, _ = evaluate_downstream(export, [MC_TASK], include_path=str(tasks), log_samples=True, out=tmp_path / "out")
    assert loglikelihoods(plain) != loglikelihoods(scaled)
