"""Evaluation: backend equality, exact sliding window, cliff/G(C) arithmetic, passkey, aggregation, plots, CLI."""

import json
import math
import shutil

import pytest
import torch

from megatron_ext.model import build_model
from pretrain.table import model_preset
from megatron_ext.positions import PositionConfig, RopePositions
from pretrain.evaluation import (HFScorer, MegatronScorer, RunInfo, aggregate, attention_entropy_ratio, cliff,
                                 context_gain, eval_cli, eval_spans, exact_window_losses, extract_answer,
                                 in_distribution_penalty, kv_cache_window_losses, load_scorer, markdown_table,
                                 passkey_examples, per_position_loss, plot_cliff_vs_size, plot_context_gain,
                                 plot_loss_curves, ruler_niah_examples, score_answer, write_csv)
from pretrain.evaluation.data import load_stream
from pretrain.evaluation.metrics import auto_batch_size

VOCAB, W, L = 300, 32, 80
CONFIG = model_preset("tiny", vocab_size=VOCAB)  # padded to 384 rows: the padding must not leak into losses
FILLER_TEXT = ("The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
               "What is the pass key? The pass key is 12345. Remember it. One of the special magic numbers "
               "for apple is: 1234567. Some special magic numbers are hidden within the following text. ") * 20


@pytest.fixture(scope="module")
def megatron_model(megatron_world):
    torch.manual_seed(0)
    return build_model(CONFIG).eval()


@pytest.fixture(scope="module")
def scorers(megatron_model):
    from pretrain.hf.export import megatron_to_llama

    info = RunInfo("tiny", W)
    hf = megatron_to_llama(megatron_model, CONFIG, vocab_size=VOCAB)
    return MegatronScorer(megatron_model, CONFIG, info), HFScorer(hf, info)


@pytest.fixture(scope="module")
def spans():
    return torch.randint(0, VOCAB, (3, L), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory):
    from data_prep.train_tokenizer import train_tokenizer

    root = tmp_path_factory.mktemp("tok")
    (root / "corpus.txt").write_text(FILLER_TEXT)
    return train_tokenizer([str(root / "corpus.txt")], str(root / "out"), "bytelevel-bpe", vocab_size=VOCAB)


def test_megatron_and_hf_backends_give_the_same_per_position_losses(scorers, spans):
    megatron, hf = scorers
    a, b = per_position_loss(megatron, spans), per_position_loss(hf, spans, batch_size=2)
    assert a.shape == (3, L - 1)
    torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("positions,scaling", [(PositionConfig(strategy="rfs", max_position=200), None),
                                               (PositionConfig(), "yarn"), (PositionConfig(), "llama3")])
def test_backends_agree_with_fractional_positions_and_rope_scaling(megatron_model, scorers, spans, positions, scaling):
    from megatron_ext.positions import RopeScaling

    rope_scaling = None if scaling is None else RopeScaling(kind=scaling, original_max_position_embeddings=W)
    info = RunInfo("tiny", W, strategy=positions.strategy)
    megatron = MegatronScorer(megatron_model, CONFIG, info, positions=positions, rope_scaling=rope_scaling)
    hf = HFScorer(scorers[1].model, info, positions=positions, rope_scaling=rope_scaling)
    rope = megatron.eval_positions(L)
    assert rope.inv_freq is not None or not torch.equal(rope.positions, torch.arange(L, dtype=torch.float32))
    torch.testing.assert_close(per_position_loss(megatron, spans), per_position_loss(hf, spans), atol=2e-5, rtol=1e-5)
    # the HF model's rotary buffers are restored afterwards
    torch.testing.assert_close(per_position_loss(scorers[1], spans), per_position_loss(scorers[0], spans),
                               atol=2e-5, rtol=1e-5)


def test_exact_sliding_window_equals_rerunning_each_window_at_its_own_positions(scorers, spans):
    megatron, hf = scorers
    window = 16
    exact = exact_window_losses(hf, spans, window, batch_size=64)
    for t in (window, 41, L - 1):  # target positions tested
        context = spans[:, t - window:t + 1]
        alone = RopePositions(torch.arange(t - window, t + 1, dtype=torch.float32))  # absolute positions
        reference = megatron.token_losses(context, alone)[:, -1]
        torch.testing.assert_close(exact[:, t - 1], reference, atol=2e-5, rtol=1e-5)
    assert torch.isnan(exact[:, :window - 1]).all()


def test_exact_window_equals_full_context_where_the_window_holds_everything(scorers, spans):
    _, hf = scorers
    full = per_position_loss(hf, spans)
    exact = exact_window_losses(hf, spans, 16)
    torch.testing.assert_close(exact[:, 15], full[:, 15], atol=2e-5, rtol=1e-5)


def test_kv_cache_window_equals_full_context_until_the_cache_is_truncated(scorers, spans):
    _, hf = scorers
    full = per_position_loss(hf, spans)
    approx = kv_cache_window_losses(hf, spans, 16, chunk=8)
    torch.testing.assert_close(approx[:, :23], full[:, :23], atol=2e-5, rtol=1e-5)  # first 24 tokens: no cut yet
    assert not torch.allclose(approx[:, 40:], full[:, 40:], atol=1e-4)


def test_context_gain_is_window_loss_minus_full_loss_over_targets_window_to_c(scorers, spans):
    _, hf = scorers
    result = context_gain(hf, spans, [48, L], window=16)
    full = per_position_loss(hf, spans[:, :48])
    exact = exact_window_losses(hf, spans[:, :48], 16)
    expected = (exact[:, 15:47] - full[:, 15:47]).double().mean().item()
    assert result["method"] == "exact" and result["window"] == 16
    assert result["values"][48] == pytest.approx(expected, abs=1e-6)
    assert result["values"][48] == pytest.approx(result["window_loss"][48] - result["full_loss"][48], abs=1e-9)


def test_cliff_arithmetic_on_a_handcrafted_loss_curve():
    # target positions t = 1..199; loss 5 for t < 25 = w/4, 3 for 25 <= t <= 100, 4 + t/100 beyond w = 100
    curve = torch.tensor([5.0 if t < 25 else 3.0 if t <= 100 else 4.0 + t / 100 for t in range(1, 200)])
    result = cliff(curve[None].repeat(2, 1), 100)
    ood = sum(4.0 + t / 100 for t in range(101, 200)) / 99
    assert result["in_dist"] == pytest.approx(3.0)
    assert result["ood"] == pytest.approx(ood)
    assert result["cliff"] == pytest.approx(ood - 3.0)


def test_cliff_needs_spans_longer_than_the_window():
    with pytest.raises(ValueError, match="longer than w"):
        cliff(torch.zeros(1, 32), 32)


def test_in_distribution_penalty_is_relative_to_the_baseline():
    assert in_distribution_penalty(3.3, 3.0) == pytest.approx(0.1)


def test_eval_spans_are_consecutive_non_overlapping_slices_from_offset_zero():
    stream = torch.arange(1000)
    out = eval_spans(stream, 4, 100)
    assert torch.equal(out[2], torch.arange(200, 300))
    with pytest.raises(ValueError, match="need 1100"):
        eval_spans(stream, 11, 100)


def test_auto_batch_size_keeps_the_token_budget():
    assert auto_batch_size(4096, 16384) == 4 and auto_batch_size(65536, 16384) == 1


def test_tokens_outside_the_vocabulary_are_a_clear_error(scorers):
    with pytest.raises(ValueError, match="different tokenizer"):
        per_position_loss(scorers[1], torch.full((1, 40), VOCAB))


def test_attention_entropy_ratio_is_the_same_through_both_backends(scorers, spans):
    a, b = (attention_entropy_ratio(s, spans[:1]) for s in scorers)
    assert a["ratio"] == pytest.approx(b["ratio"], rel=1e-4)
    assert a["ood"] > a["in_dist"] > 0  # more keys, more entropy for a random model


def test_passkey_examples_are_deterministic_full_length_and_hold_the_key(tokenizer_path):
    from data_prep.tokenizers import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_path)
    first, again = passkey_examples(tokenizer, 400, 5, seed=3), passkey_examples(tokenizer, 400, 5, seed=3)
    assert [e.prompt for e in first] == [e.prompt for e in again]
    assert len({e.answer for e in first}) > 1 and all(len(e.answer) == 5 for e in first)
    for example in first:
        text = tokenizer.decode(example.prompt)
        assert len(example.prompt) == 400
        assert f"The pass key is {example.answer}." in text and text.endswith("The pass key is")
    ruler = ruler_niah_examples(tokenizer, 400, 2, seed=3)
    assert all(len(e.answer) == 7 and e.answer in tokenizer.decode(e.prompt) for e in ruler)


def test_passkey_scoring_is_exact_match_on_the_first_number_of_key_length():
    assert score_answer(" 12345. Remember", "12345")
    assert not score_answer(" 123456", "12345") and not score_answer(" 1234 5", "12345")
    assert extract_answer("key 99 then 54321 and 12345", 5) == "54321"


def _record(run, label, seed, in_dist, ood, gain, params=1e6, strategy="none"):
    curve = [in_dist] * 40 + [ood] * 40
    return {"run": run, "label": label, "seed": seed, "strategy": strategy, "parameters": params,
            "train_window": 40, "lengths": {"81": {"loss": sum(curve) / 80, "curve": curve,
                                                    "cliff": {"in_dist": in_dist, "ood": ood, "cliff": ood - in_dist}}},
            "context_gain": {"method": "exact", "window": 16, "values": {"64": gain}}}


RECORDS = [_record("base_s1", "base", 1, 3.0, 5.0, 0.1), _record("base_s2", "base", 2, 3.2, 5.4, 0.3),
           _record("pa_s1", "posaug", 1, 3.3, 3.5, 0.2, strategy="posaug"),
           _record("pa_s2", "posaug", 2, 3.3, 3.7, 0.4, strategy="posaug")]


def test_aggregate_gives_mean_and_sample_std_over_seeds_and_the_penalty():
    rows = {r["label"]: r for r in aggregate(RECORDS, baseline="base")}
    base, posaug = rows["base"]["metrics"], rows["posaug"]["metrics"]
    assert base["cliff@81"][0] == pytest.approx(2.1) and base["cliff@81"][1] == pytest.approx(math.sqrt(0.02))
    assert posaug["G(64)"] == pytest.approx((0.3, math.sqrt(0.02)))
    assert posaug["penalty@81"][0] == pytest.approx((0.3 / 3.0 + 0.1 / 3.2) / 2)  # vs the same seed's baseline
    assert base["penalty@81"][0] == pytest.approx(0.0)
    assert "2.100 ± 0.141" in markdown_table(list(rows.values()), ["cliff@81"])


def test_aggregate_rejects_an_unknown_baseline():
    with pytest.raises(ValueError, match="baseline 'nope'"):
        aggregate(RECORDS, baseline="nope")


def test_tables_and_plots_are_written_and_non_empty(tmp_path):
    rows = aggregate(RECORDS)
    paths = [write_csv(rows, tmp_path / "t.csv"), plot_loss_curves(RECORDS, tmp_path / "loss.png"),
             plot_context_gain(RECORDS, tmp_path / "gain.png"), plot_cliff_vs_size(RECORDS, tmp_path / "cliff.png")]
    for path in paths:
        assert path.is_file() and path.stat().st_size > 200
    assert (tmp_path / "loss.png").read_bytes()[:4] == b"\x89PNG"


def test_hf_directory_without_train_window_is_a_clear_error(scorers, tmp_path):
    scorers[1].model.save_pretrained(tmp_path / "hf")
    with pytest.raises(ValueError, match="--train-window"):
        load_scorer(tmp_path / "hf")


def test_cli_evaluates_an_hf_directory_on_a_text_file_and_reports(scorers, tokenizer_path, tmp_path):
    model_dir = tmp_path / "hf_s1"
    scorers[1].model.save_pretrained(model_dir)
    shutil.copy(tokenizer_path, model_dir / "tokenizer.json")
    (tmp_path / "text.jsonl").write_text("".join(json.dumps({"text": FILLER_TEXT[i:i + 900]}) + "\n"
                                                 for i in range(0, 5400, 900)))
    code = eval_cli([str(model_dir), "--data", str(tmp_path / "text.jsonl"), "--train-window", str(W),
                     "--lengths", "64", "--num-spans", "2", "--context-gain", "48,64", "--gain-window", "16",
                     "--passkey-lengths", "400", "--passkey-n", "1", "--entropy-spans", "1",
                     "--output", str(tmp_path / "records"), "--no-progress"])
    assert code == 0
    record = json.loads((tmp_path / "records" / "hf_s1.json").read_text())
    assert record["label"] == "hf" and len(record["lengths"]["64"]["curve"]) == 63
    assert set(record["context_gain"]["values"]) == {"48", "64"} and record["passkey"]["400"]["n"] == 1
    stream = load_stream(str(tmp_path / "text.jsonl"), str(model_dir))
    expected = per_position_loss(scorers[1], eval_spans(stream, 2, 64)).double().mean().item()
    assert record["lengths"]["64"]["loss"] == pytest.approx(expected, abs=1e-6)
    assert eval_cli(["report", str(tmp_path / "records"), "--output", str(tmp_path / "report")]) == 0
    assert (tmp_path / "report" / "summary.md").read_text().startswith("| run |")
    assert (tmp_path / "report" / "loss_curves.png").stat().st_size > 200


def test_cli_reports_a_missing_checkpoint_as_an_error(tmp_path, capsys):
    assert eval_cli([str(tmp_path / "nope"), "--data", str(tmp_path), "--lengths", "64"]) == 2
    assert "no such checkpoint" in capsys.readouterr().err


def test_max_batch_tokens_sets_the_number_of_spans_per_forward_pass(scorers, spans):
    megatron, _ = scorers
    batch_sizes = []
    original = megatron.token_losses

    def recording(tokens, rope=None):
        batch_sizes.append(tokens.shape[0])
        return original(tokens, rope)

    megatron.token_losses = recording
    try:
        per_position_loss(megatron, spans, max_batch_tokens=2 * L)
    finally:
        del megatron.token_losses
    assert batch_sizes == [2, 1]
