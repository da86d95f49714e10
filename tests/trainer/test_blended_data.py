"""Weighted blending of data_prep outputs (data.data_path: [w1, prefix1, w2, prefix2]) via Megatron's
BlendedDataset: realised proportions, and the validation of weights, manifests and tokenizers.
Runtime: ~25 s (two tiny data_prep builds shared by the module).
"""

import json
import math
import shutil
from pathlib import Path

import pytest

from conftest import TINY_TRAIN, run_train
from data_prep.manifest import load_manifest, manifest_path
from pretrain.trainer.config import from_dict
from pretrain.trainer.data import build_datasets

SEQ, SAMPLES = 32, 2000
REPEATED_WORD = "zebra"


@pytest.fixture(scope="module")
def repeated_word_shards(tiny_shards, tmp_path_factory) -> str:
    """A second data_prep output with the tiny corpus's tokenizer whose text is one word repeated."""
    from data_prep.cli import main as data_prep

    root = tmp_path_factory.mktemp("repeated_word")
    docs = root / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": " ".join([REPEATED_WORD] * 400)}) + "\n" for _ in range(40)))
    prefix = str(root / "shards" / "zebra")
    assert data_prep(["build", "--input", str(docs), "--tokenizer", load_manifest(tiny_shards).tokenizer_path,
                      "--data-prefix", prefix, "--num-shards", "2", "--valid-docs", "4", "--no-progress"]) == 0
    return prefix


def repeated_word_share(train, tokens_of_word: set[int]) -> float:
    """Fraction of samples made only of the repeated word's tokens (and EOD): the second output's share."""
    hits = sum(set(train[i]["tokens"].tolist()) <= tokens_of_word for i in range(SAMPLES))
    return hits / SAMPLES


@pytest.mark.parametrize("weight", [0.2, 0.5])
def test_blend_realises_the_weights_within_binomial_tolerance(megatron_world, tiny_shards, repeated_word_shards, tmp_path, weight):
    train, _ = build_datasets([1 - weight, tiny_shards, weight, repeated_word_shards], SEQ, seed=3,
                              num_train=SAMPLES, num_valid=0, cache_dir=tmp_path)
    word_only, _ = build_datasets(repeated_word_shards, SEQ, seed=3, num_train=50, num_valid=0, cache_dir=tmp_path)
    tokens_of_word = {t for i in range(50) for t in word_only[i]["tokens"].tolist()}
    assert len(train) >= SAMPLES
    share = repeated_word_share(train, tokens_of_word)
    assert abs(share - weight) <= 4 * math.sqrt(weight * (1 - weight) / SAMPLES)


def test_blend_weights_need_not_sum_to_one(megatron_world, tiny_shards, repeated_word_shards, tmp_path):
    train, _ = build_datasets([3, tiny_shards, 1, repeated_word_shards], SEQ, seed=3, num_train=SAMPLES,
                              num_valid=0, cache_dir=tmp_path)
    word_only, _ = build_datasets(repeated_word_shards, SEQ, seed=3, num_train=50, num_valid=0, cache_dir=tmp_path)
    tokens_of_word = {t for i in range(50) for t in word_only[i]["tokens"].tolist()}
    assert abs(repeated_word_share(train, tokens_of_word) - 0.25) <= 4 * math.sqrt(0.25 * 0.75 / SAMPLES)


def test_blend_builds_a_validation_stream_from_every_output(megatron_world, tiny_shards, repeated_word_shards, tmp_path):
    _, valid = build_datasets([0.5, tiny_shards, 0.5, repeated_word_shards], SEQ, seed=3, num_train=100,
                              num_valid=20, cache_dir=tmp_path)
    assert valid is not None and len(valid) >= 20


def blend_config(data_path):
    return from_dict({"preset": "tiny", "data": {"data_path": data_path},
                      "schedule": {"train_iters": 2, "global_batch_size": 8, "micro_batch_size": 2}})


@pytest.mark.parametrize("data_path,message", [
    (lambda a, b: [0.5, a, b], "alternates weights and data_prep prefixes"),
    (lambda a, b: [0.0, a, 1.0, b], "needs a positive weight"),
    (lambda a, b: [-1, a, 1.0, b], "needs a positive weight"),
    (lambda a, b: ["heavy", a, 1.0, b], "needs a positive weight"),
    (lambda a, b: [0.5, a, 0.5, b + "_missing"], "no manifest for"),
], ids=["odd_length", "zero_weight", "negative_weight", "weight_not_a_number", "missing_manifest"])
def test_invalid_blend_is_refused_naming_data_path(tiny_shards, repeated_word_shards, data_path, message):
    with pytest.raises(ValueError, match=f"data.data_path.*{message}"):
        blend_config(data_path(tiny_shards, repeated_word_shards)).validate(world_size=1)


def test_blend_of_outputs_with_different_tokenizers_is_refused(tiny_shards, repeated_word_shards, tmp_path):
    other = tmp_path / "other"
    manifest = json.loads(Path(manifest_path(repeated_word_shards)).read_text())
    manifest["tokenizer"]["sha256"] = "0" * 64  # as if built with a retrained tokenizer
    for shard in manifest["shards"] + [manifest["valid"]]:
        shard["prefix"] = str(Path(repeated_word_shards).parent / Path(shard["prefix"]).name)
    Path(manifest_path(str(other))).write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="tokenizer sha256 differs"):
        blend_config([0.5, tiny_shards, 0.5, str(other)]).validate(world_size=1)


def test_train_cli_refuses_a_bad_blend_with_one_line_and_exit_code_2(tiny_shards):
    proc = run_train([*TINY_TRAIN, "schedule.train_iters=3", f"data.data_path=[0.5,{tiny_shards},0.5]"],
                     check=False, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "data.data_path" in proc.stderr


@pytest.mark.slow
def test_train_runs_on_a_blend(tiny_shards, repeated_word_shards, tmp_path):
    proc = run_train([*TINY_TRAIN, "schedule.train_iters=3", f"checkpoint.save={tmp_path / 'run'}",
                      f"data.data_path=[0.7,{tiny_shards},0.3,{repeated_word_shards}]"], timeout=300)
    assert "step 3/3" in proc.stdout
