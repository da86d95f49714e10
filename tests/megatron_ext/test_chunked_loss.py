"""model.cross_entropy_fusion_impl=chunked: the loss and every gradient equal Megatron's, without a
[tokens × vocab] logits tensor (megatron_ext.kernels.linear_cross_entropy, megatron_ext.chunked_loss).

Tolerances: float32, loss within 1e-6 and gradients within 1e-6 absolute (the same float32 operations, the weight
gradient summed chunk by chunk); bf16, gradients bit-equal at one chunk. Megatron's own 'native' fusion also runs
on CPU (0.16.1, bf16: the same loss and gradients as its unfused path) but its torch.compile'd pieces take ~100 s
here, so it is not in this suite. Runtime: ~25 s on 2 cores (TP = 2 under torchrun ~15 s).
"""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import run_torchrun
from megatron_ext.kernels.linear_cross_entropy import linear_cross_entropy, linear_cross_entropy_reference
from megatron_ext.model import ModelConfig, build_model
from pretrain.table import model_preset

B, S = 2, 16
TOKENS = torch.randint(0, 256, (B, S + 1), generator=torch.Generator().manual_seed(7))
POSITIONS = torch.sort(torch.rand(B, S, generator=torch.Generator().manual_seed(1)) * 100).values


def test_chunked_linear_cross_entropy_equals_the_reference_loss_and_gradients():
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(23, 8, generator=g, requires_grad=True)  # 23 tokens in chunks of 5: a short last chunk
    weight = torch.randn(40, 8, generator=g, requires_grad=True)
    target = torch.randint(0, 40, (23,), generator=g)
    grad = torch.rand(23, generator=g)
    ours = linear_cross_entropy(hidden, weight, target, chunk=5)
    theirs = linear_cross_entropy_reference(hidden, weight, target)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)
    for a, b in zip(torch.autograd.grad(ours, (hidden, weight), grad),
                    torch.autograd.grad(theirs, (hidden, weight), grad)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def _loss_and_grads(chunked: bool, **fields):
    torch.manual_seed(0)
    model = build_model(model_preset("tiny", cross_entropy_loss_fusion=chunked, **fields))
    loss = model(TOKENS[:, :-1], POSITIONS, None, labels=TOKENS[:, 1:])
    loss.mean().backward()
    return model, loss.detach(), torch.cat([p.grad.flatten() for p in model.parameters()])


def test_model_loss_and_gradients_equal_megatrons_at_tp1(megatron_world):
    _, loss, grads = _loss_and_grads(True)
    _, loss_stock, grads_stock = _loss_and_grads(False)
    assert loss.shape == (B, S)
    torch.testing.assert_close(loss, loss_stock, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grads, grads_stock, rtol=1e-5, atol=1e-6)


def test_bf16_model_loss_and_gradients_equal_megatrons(megatron_world):
    # bf16 logits, float32 loss, gradients cast to bf16 before the matmuls: the same steps as Megatron's autograd
    _, loss, grads = _loss_and_grads(True, bf16=True)
    _, loss_stock, grads_stock = _loss_and_grads(False, bf16=True)
    torch.testing.assert_close(loss, loss_stock, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grads, grads_stock, rtol=0, atol=0)


class _LargestVocabTensor(TorchDispatchMode):
    """The most elements of any new tensor (not a view) an op produced whose last dimension is the vocabulary."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab, self.largest = vocab, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.is_view:  # weight.t() is [h, V]: no new memory
            return out
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and t.dim() >= 1 and t.shape[-1] == self.vocab:
                self.largest = max(self.largest, t.numel())
        return out


def test_no_tokens_by_vocab_logits_are_materialised_in_forward_or_backward(megatron_world, monkeypatch):
    from megatron_ext import chunked_loss

    sizes = dict(vocab_size=300, make_vocab_size_divisible_by=4)  # a vocabulary no other dimension equals
    vocab, chunk = model_preset("tiny", **sizes).padded_vocab_size(), 4  # chunks smaller than the 32 tokens
    kernel = chunked_loss.linear_cross_entropy
    monkeypatch.setattr(chunked_loss, "linear_cross_entropy", lambda *a, **k: kernel(*a, **{**k, "chunk": chunk}))
    model = build_model(model_preset("tiny", cross_entropy_loss_fusion=True, **sizes))
    with _LargestVocabTensor(vocab) as seen:
        model(TOKENS[:, :-1], POSITIONS, None, labels=TOKENS[:, 1:]).mean().backward()
    assert seen.largest == chunk * vocab
    with _LargestVocabTensor(vocab) as stock:
        build_model(model_preset("tiny", **sizes))(TOKENS[:, :-1], POSITIONS, None,
                                                   labels=TOKENS[:, 1:]).mean().backward()
    assert stock.largest == B * S * vocab  # what the chunks avoid


def test_a_forward_without_labels_still_returns_megatrons_logits(megatron_world):
    torch.manual_seed(0)
    chunked = build_model(model_preset("tiny", cross_entropy_loss_fusion=True))
    torch.manual_seed(0)
    stock = build_model(model_preset("tiny"))
    torch.testing.assert_close(chunked(TOKENS[:, :-1], POSITIONS, None), stock(TOKENS[:, :-1], POSITIONS, None))


def test_native_fusion_on_a_float32_model_is_refused_naming_the_fix():
    with pytest.raises(ValueError, match="model.cross_entropy_fusion_impl=native.*model.bf16=true"):
        ModelConfig(cross_entropy_loss_fusion=True, cross_entropy_fusion_impl="native")


@pytest.mark.slow
def test_loss_and_gradients_equal_megatrons_at_tp2_with_and_without_sequence_parallel():
    records = run_torchrun("tests/distributed/chunked_loss_tp.py", 2, timeout=300)
    assert sorted((r["layout"], r["rank"]) for r in records) == [("tp2", 0), ("tp2", 1), ("tp2_sp", 0), ("tp2_sp", 1)]
    for record in records:
        assert record["loss_diff"] <= 1e-6 and record["grad_diff"] <= 1e-6, record
