"""The PosAug and baseline per-position loss over 8w spans computed through llama.cpp (export-gguf's F32 GGUF)
equals `eval run`'s on the same spans: the curve within LOSS_TOLERANCE at every position, the cliff too."""

import json

import pytest
import torch

from llama_cpp_helpers import WINDOW, require_llama_cpp, train_tiny, train_tokenizers

require_llama_cpp()

LENGTH, SPANS = 8 * WINDOW, 4
LOSS_TOLERANCE = 1e-4  # nats; F32 logits agree to ~1e-6 (test_llama_cpp_exports.py)


@pytest.fixture(scope="module")
def setup(megatron_world, tmp_path_factory):
    """A PosAug and a baseline checkpoint, a SentencePiece tokenizer, and evaluation text."""
    root = tmp_path_factory.mktemp("cliff")
    files, texts = train_tokenizers(root / "tokenizers")
    (root / "eval.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    runs = {"posaug": train_tiny(root / "posaug"), "baseline": train_tiny(root / "baseline",
                                                                         positions={"strategy": "none"})}
    return root, runs, files["sentencepiece-bpe"]


@pytest.mark.parametrize("method", ["posaug", "baseline"])
def test_per_position_loss_through_llama_cpp_equals_eval_runs_cliff(setup, method):
    from pretrain.evaluation.cli import eval_cli
    from pretrain.evaluation.data import eval_spans, load_stream
    from pretrain.evaluation.metrics import cliff
    from pretrain.hf.gguf_check import llama_cpp_model, llama_cpp_token_losses
    from pretrain.hf.gguf_export import export_gguf

    root, runs, tokenizer = setup
    data, out = str(root / "eval.jsonl"), root / f"eval_{method}"
    assert eval_cli(["run", runs[method], "--data", data, "--tokenizer", tokenizer, "--lengths", str(LENGTH),
                     "--num-spans", str(SPANS), "--output", str(out), "--no-progress"]) == 0
    record = json.loads(next(out.glob("*.json")).read_text())["lengths"][str(LENGTH)]
    gguf = export_gguf(runs[method], root / f"gguf_{method}", tokenizer=tokenizer)["gguf"]
    llm = llama_cpp_model(gguf, LENGTH)
    try:
        losses = llama_cpp_token_losses(llm, eval_spans(load_stream(data, tokenizer), SPANS, LENGTH))
    finally:
        llm.close()
    ours = cliff(losses, WINDOW, in_start=record["cliff"]["in_start"])
    for key in ("cliff", "in_dist", "ood"):
        assert ours[key] == pytest.approx(record["cliff"][key], abs=LOSS_TOLERANCE), key
    torch.testing.assert_close(losses.double().mean(0), torch.tensor(record["curve"], dtype=torch.float64),
                               atol=LOSS_TOLERANCE, rtol=0)
