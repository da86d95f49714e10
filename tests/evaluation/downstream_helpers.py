"""Fixtures of the downstream tests: local lm-eval task YAML files (no download) and tiny finished runs."""

import json
from pathlib import Path

import yaml

# HellaSwag's shape: a context, four endings, the index of the right one (endings without the
# leading space: lm-eval puts its target_delimiter " " in front of each).
MC_DOCS = [
    {"ctx": "The cat sat on the", "endings": ["mat.", "sky.", "river of time.", "green"], "label": 0},
    {"ctx": "She opened the door and", "endings": ["walked in.", "blue", "the the", "sang loudly to it."],
     "label": 0},
    {"ctx": "Water is", "endings": ["wet.", "a number", "seven dogs", "quickly"], "label": 0},
    {"ctx": "In the morning the sun", "endings": ["rises.", "eats bread", "is a table", "of"], "label": 0},
    {"ctx": "He read the", "endings": ["book.", "rain", "under", "sixteen"], "label": 0},
    {"ctx": "The river flows to the", "endings": ["sea.", "chair", "yesterday", "loud"], "label": 0},
]
PPL_DOCS = [{"text": "The cat sat on the mat."}, {"text": "Water is wet and the sea is blue."},
            {"text": "He read the book in the morning."}]

MC_TASK = "tiny_hellaswag"
PPL_TASK = "tiny_ppl"


def write_tasks(root: Path) -> Path:
    """A directory of task YAML files reading local JSON lines (lm-eval's `dataset_path: json`)."""
    root.mkdir(parents=True, exist_ok=True)
    for name, docs in (("mc.jsonl", MC_DOCS), ("ppl.jsonl", PPL_DOCS)):
        (root / name).write_text("\n".join(json.dumps(d) for d in docs) + "\n")
    mc = {"task": MC_TASK, "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(root / "mc.jsonl")}},
          "test_split": "test", "output_type": "multiple_choice", "doc_to_text": "{{ctx}}",
          "doc_to_target": "{{label}}", "doc_to_choice": "{{endings}}",
          "metric_list": [{"metric": m, "aggregation": "mean", "higher_is_better": True} for m in ("acc", "acc_norm")],
          "metadata": {"version": 1.0}}
    ppl = {"task": PPL_TASK, "dataset_path": "json",
           "dataset_kwargs": {"data_files": {"test": str(root / "ppl.jsonl")}},
           "test_split": "test", "output_type": "loglikelihood_rolling", "doc_to_text": "",
           "doc_to_target": "{{text}}",
           "metric_list": [{"metric": m, "aggregation": agg, "higher_is_better": False}
                           for m, agg in (("word_perplexity", "weighted_perplexity"),
                                          ("byte_perplexity", "weighted_perplexity"),
                                          ("bits_per_byte", "bits_per_byte"))],
           "metadata": {"version": 1.0}}
    (root / "tasks").mkdir(exist_ok=True)
    (root / "tasks" / "tiny_hellaswag.yaml").write_text(yaml.safe_dump(mc))
    (root / "tasks" / "tiny_ppl.yaml").write_text(yaml.safe_dump(ppl))
    return root / "tasks"


def write_broken_task(root: Path, name: str, dataset_path: str, data_files: str | None) -> Path:
    """A task whose data cannot be had: a missing local file, or a hub dataset while offline."""
    task = {"task": name, "dataset_path": dataset_path, "test_split": "test", "output_type": "multiple_choice",
            "doc_to_text": "{{ctx}}", "doc_to_target": "{{label}}", "doc_to_choice": "{{endings}}",
            "metric_list": [{"metric": "acc"}]}
    if data_files:
        task["dataset_kwargs"] = {"data_files": {"test": data_files}}
    root.mkdir(parents=True, exist_ok=True)
    (root / f"{name}.yaml").write_text(yaml.safe_dump(task))
    return root


def make_finished_run(run_dir: Path, data_path: str, strategy: str, seed: int = 1234) -> Path:
    """A run directory as the trainer leaves it (config.yaml, status.json, checkpoint), trained 2 steps."""
    from hf_save_checkpoint import tiny_config, train_and_save
    from pretrain.trainer.config import dump
    from pretrain.trainer.config_sections import DataConfig
    from pretrain.trainer.metrics import write_status

    config = tiny_config(str(run_dir), groups=2, untied=False, positions={"strategy": strategy})
    config.data = DataConfig(data_path=data_path)
    config.seed = seed
    train_and_save(config)
    (run_dir / "config.yaml").write_text(dump(config))
    write_status(run_dir, "finished", 2, 2)
    return run_dir


OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def offline_env(monkeypatch, cache: Path) -> None:
    """Nothing may be downloaded: hub and datasets offline (read by datasets at import), cache in tmp."""
    for key, value in {**OFFLINE, "HF_DATASETS_CACHE": str(cache)}.items():
        monkeypatch.setenv(key, value)
