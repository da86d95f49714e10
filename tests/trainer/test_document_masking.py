"""data.document_masking and data.eod_mask_loss: documents from every data source, EOD loss masking,
refusals, and a real training run with both on."""

import pytest
import torch

from conftest import TINY_TRAIN, run_train, tensorboard_scalars
from pretrain.trainer import config as cfg
from pretrain.trainer.data import DocumentSamples, SyntheticTokens, build_datasets, document_eod

VOCAB, S = 512, 64


def synthetic(eod=VOCAB - 1):
    return SyntheticTokens(VOCAB, S, seed=3, size=400, eod=eod)


def test_synthetic_tokens_without_eod_are_unchanged_by_the_option():
    plain, again = SyntheticTokens(VOCAB, S, seed=3, size=100), synthetic(eod=None)
    assert torch.equal(plain[5]["tokens"], again[5]["tokens"])


def test_synthetic_documents_end_with_eod_about_four_times_a_window():
    counts = [int((synthetic()[i]["tokens"] == VOCAB - 1).sum()) for i in range(400)]
    assert 2 < sum(counts) / len(counts) < 6
    assert min(counts) == 0  # some windows lie inside a document longer than the window


def test_document_index_counts_the_eod_inputs_before_each_token():
    sample = DocumentSamples(synthetic(), VOCAB - 1, document_masking=True, eod_mask_loss=False)[7]
    is_eod = (sample["tokens"] == VOCAB - 1).long()
    assert torch.equal(sample["document_index"], is_eod.cumsum(0) - is_eod)


def test_eod_mask_loss_zeroes_the_loss_of_every_eod_input_only():
    source = synthetic()
    sample = DocumentSamples(source, VOCAB - 1, document_masking=False, eod_mask_loss=True)[7]
    is_eod = sample["tokens"] == VOCAB - 1
    assert is_eod.any()
    assert torch.equal(sample["loss_mask"], (~is_eod).float())
    assert "document_index" not in sample
    assert torch.equal(source[7]["loss_mask"], torch.ones(S))  # the wrapped source is not modified


def test_task_examples_keep_their_loss_mask_and_their_padding_is_a_document():
    from pretrain.tasks.source import TaskSource

    source = TaskSource("copy", 3, 6, seq_length=24, seed=1)
    eod = document_eod(type("Data", (), {"task": "copy", "synthetic": False})(), 64)
    sample = DocumentSamples(source, eod, document_masking=True, eod_mask_loss=True)[0]
    n = int(sample["position_length"])
    assert sample["document_index"].tolist() == [0] * n + [1] * (24 - n)
    assert torch.equal(sample["loss_mask"], source[0]["loss_mask"])


def test_blended_data_prep_shards_give_documents_at_the_tokenizers_eod(megatron_world, tiny_shards, tmp_path):
    data = type("Data", (), {"task": None, "synthetic": False, "data_path": [0.5, tiny_shards, 0.5, tiny_shards]})()
    eod = document_eod(data, VOCAB)
    # enough samples to cross a document boundary whatever the corpus (the embedded one is this Python's own
    # standard library, whose files, and so documents, differ in length between Python versions)
    train, _ = build_datasets(data.data_path, S, 1, 2000, 0, tmp_path)
    samples = DocumentSamples(train, eod, document_masking=True, eod_mask_loss=True)
    sample = next(samples[i] for i in range(2000) if (samples[i]["tokens"] == eod).any())
    is_eod = (sample["tokens"] == eod).long()
    assert torch.equal(sample["document_index"], is_eod.cumsum(0) - is_eod)
    assert torch.equal(sample["loss_mask"], 1.0 - is_eod.float())


def test_context_parallel_with_document_masking_is_refused_in_one_line():
    config = cfg.load(None, ["preset=tiny", "data.synthetic=true", "data.document_masking=true"])
    config.parallel.context_parallel_size = 2
    with pytest.raises(ValueError, match=r"data.document_masking=true with parallel.context_parallel_size > 1"):
        cfg._check_document_masking(config)


def test_transformer_engine_with_document_masking_is_refused_in_one_line():
    config = cfg.load(None, ["preset=tiny", "data.synthetic=true", "data.document_masking=true"])
    config.model.transformer_impl = "transformer_engine"
    with pytest.raises(ValueError, match="needs model.transformer_impl=local"):
        cfg._check_document_masking(config)


def test_pose_with_document_masking_is_refused_in_one_line():
    config = cfg.load(None, ["preset=tiny", "data.synthetic=true", "data.document_masking=true",
                             "positions.strategy=pose", "positions.max_position=256"])
    with pytest.raises(ValueError, match="positions.strategy=pose with data.document_masking=true"):
        config.validate(world_size=1)


@pytest.mark.slow
def test_training_with_document_masking_and_eod_mask_loss_runs_on_data_prep_shards(tiny_shards, tmp_path):
    run_train([*TINY_TRAIN, f"data.data_path={tiny_shards}", "schedule.train_iters=6", "positions.strategy=rfs",
               "data.document_masking=true", "data.eod_mask_loss=true", f"checkpoint.save={tmp_path}"])
    losses = tensorboard_scalars(tmp_path, "train/loss")
    assert sorted(losses) == list(range(1, 7)) and all(0 < v < 10 for v in losses.values())
