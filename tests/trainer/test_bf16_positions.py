"""Positions in BF16 (issue 42): the RoPE angles a bf16 model builds are float32 and equal the fp32 model's bit for
bit at the largest positions runs produce: PosAug's alpha = 8 over the 1b window (2048), and evaluation at 16x it.
ALiBi's slopes stay float32 as well. In-process, one gloo rank; the decoder is never run (the angles are taken
where GPTModel hands them to it), so a 32k-token sequence costs only its embedding."""

import pytest
import torch

from megatron_ext.model import ParallelConfig, build_model
from pretrain.table import model_preset

WINDOW = 2048  # pretrain/configs/1b_*.yaml model.seq_length
SHAPES_1B = {k: v for k, v in model_preset("1b").__dict__.items() if k in ("kv_channels", "rotary_base")}


class _Angles(Exception):
    """Raised by the decoder pre-hook to hand the angles out and stop the forward."""


def rope_angles(model, positions: torch.Tensor) -> torch.Tensor:
    """The rotary_pos_emb GPTModel passes to its decoder for `positions` (the decoder is not run)."""

    def capture(_module, _args, kwargs):
        raise _Angles(kwargs["rotary_pos_emb"])

    handle = model.decoder.register_forward_pre_hook(capture, with_kwargs=True)
    try:
        model(torch.zeros(1, positions.shape[-1], dtype=torch.long), positions, None)
    except _Angles as angles:
        return angles.args[0]
    finally:
        handle.remove()
    raise AssertionError("the decoder was never called")


def small_model(bf16: bool, **overrides):
    """One small layer with the 1b model's head size and RoPE base: the angles depend on nothing else."""
    config = model_preset("tiny", bf16=bf16, seq_length=WINDOW, num_layers=1, hidden_size=4 * SHAPES_1B["kv_channels"],
                          ffn_hidden_size=64, **{**SHAPES_1B, **overrides})
    return build_model(config, ParallelConfig()).eval()


@pytest.fixture(scope="module")
def models(megatron_world):
    return {"fp32": small_model(False), "bf16": small_model(True)}


def test_bf16_model_holds_only_bf16_parameters(models):
    assert {p.dtype for p in models["bf16"].parameters()} == {torch.bfloat16}


@pytest.mark.parametrize("positions", [
    pytest.param(8.0 * torch.arange(WINDOW, dtype=torch.float32), id="posaug_alpha8_1b_window"),
    pytest.param(torch.arange(16 * WINDOW, dtype=torch.float32), id="evaluation_at_16x_window"),
])
def test_bf16_rope_angles_are_float32_and_equal_the_fp32_models(models, positions):
    with torch.no_grad():
        fp32, bf16 = rope_angles(models["fp32"], positions), rope_angles(models["bf16"], positions)
    assert bf16.dtype == torch.float32
    assert torch.equal(bf16, fp32)
    # and they are the exact float32 products position x inv_freq: nothing was rounded through bf16 on the way
    inv_freq = models["fp32"].rotary_pos_emb.inv_freq.float()
    assert torch.equal(bf16[:, 0, 0, : inv_freq.numel()], positions[:, None] * inv_freq)


def test_bf16_alibi_slopes_stay_float32(megatron_world):
    model = small_model(True, position_embedding_type="alibi")
    assert model.alibi_slopes.dtype == torch.float32
