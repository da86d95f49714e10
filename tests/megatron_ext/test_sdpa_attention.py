"""model.core_attention=sdpa: torch SDPA inside Megatron's local layers equals Megatron's own attention.

Runtime: ~8 s on 2 cores (tiny models, forward + backward).
"""

import pytest
import torch
from megatron.core.transformer.dot_product_attention import DotProductAttention

from megatron_ext.model import ModelConfig, build_model
from megatron_ext.positions import RopePositions
from megatron_ext.sdpa_attention import SDPADotProductAttention, materialized_probabilities
from pretrain.table import model_preset as preset

B, S = 2, 24


def _build(core_attention: str, **fields) -> torch.nn.Module:
    torch.manual_seed(0)  # same initial weights for both attentions
    return build_model(preset("tiny", core_attention=core_attention, **fields))


def _logits_and_grads(model, positions) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(0, 256, (B, S), generator=torch.Generator().manual_seed(3))
    model.zero_grad(set_to_none=True)
    logits = model(tokens, positions, None)
    (logits.float() ** 2).mean().backward()
    return logits.detach(), torch.cat([p.grad.flatten() for p in model.parameters()])


def _cores(model) -> list:
    return [m for m in model.modules() if isinstance(m, DotProductAttention)]


def test_local_layers_use_sdpa_by_default(megatron_world):
    assert ModelConfig().core_attention == "sdpa"
    assert all(type(core) is SDPADotProductAttention for core in _cores(_build("sdpa")))


def test_core_attention_megatron_keeps_megatrons_dot_product_attention(megatron_world):
    assert all(type(core) is DotProductAttention for core in _cores(_build("megatron")))


def test_unknown_core_attention_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="model.core_attention"):
        ModelConfig(core_attention="flash")


@pytest.mark.parametrize("positions", [
    torch.arange(S, dtype=torch.float32),
    torch.arange(S, dtype=torch.float32) * 3.7,  # PosAug alpha
    torch.sort(torch.rand(B, S, generator=torch.Generator().manual_seed(1)) * 200).values,  # per-sample RFS
], ids=["integer", "scaled", "per_sample_float"])
def test_sdpa_logits_and_gradients_equal_megatrons_attention(megatron_world, positions):
    # tiny has GQA (4 heads, 2 groups): SDPA's enable_gqa against Megatron's repeat_interleave.
    logits_m, grads_m = _logits_and_grads(_build("megatron"), positions)
    logits_s, grads_s = _logits_and_grads(_build("sdpa"), positions)
    torch.testing.assert_close(logits_s, logits_m, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grads_s, grads_m, rtol=1e-4, atol=1e-6)


def test_sdpa_honours_the_yarn_attention_factor(megatron_world):
    rope = RopePositions(torch.arange(S, dtype=torch.float32), attention_factor=1.3)
    logits_m, _ = _logits_and_grads(_build("megatron"), rope)
    logits_s, _ = _logits_and_grads(_build("sdpa"), rope)
    plain_s, _ = _logits_and_grads(_build("sdpa"), torch.arange(S, dtype=torch.float32))
    torch.testing.assert_close(logits_s, logits_m, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(logits_s, plain_s)


def test_materialized_probabilities_hand_the_attention_probabilities_to_dropout_hooks(megatron_world):
    model = _build("sdpa").eval()
    seen = []
    handles = [core.attention_dropout.register_forward_hook(lambda m, a, out: seen.append(out))
               for core in _cores(model)]
    tokens = torch.zeros(1, S, dtype=torch.long)
    with torch.no_grad():
        model(tokens, torch.arange(S, dtype=torch.float32), None)
        assert seen == []  # SDPA: the probabilities never exist
        with materialized_probabilities(model):
            model(tokens, torch.arange(S, dtype=torch.float32), None)
    for handle in handles:
        handle.remove()
    assert len(seen) == len(_cores(model))
    torch.testing.assert_close(seen[0].sum(-1), torch.ones(1, 4, S, S)[..., 0])
    assert all(not core.materialize_probabilities for core in _cores(model))


def test_attention_dropout_in_training_takes_megatrons_path(megatron_world):
    model = _build("sdpa", attention_dropout=0.1).train()
    calls = []
    handles = [core.attention_dropout.register_forward_hook(lambda m, a, out: calls.append(1))
               for core in _cores(model)]
    model(torch.zeros(1, S, dtype=torch.long), torch.arange(S, dtype=torch.float32), None)
    for handle in handles:
        handle.remove()
    assert len(calls) == len(_cores(model))
