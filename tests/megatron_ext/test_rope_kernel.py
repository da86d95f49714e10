"""The fused RoPE kernel (megatron_ext.kernels.rope) equals Megatron's unfused `_apply_rotary_pos_emb_bshd`.

Runs on CPU through Triton's interpreter (TRITON_INTERPRET=1, set per test: the kernel is jitted on first launch
in the mode of that moment). Tolerances: float32 values and gradients within 1e-5 of Megatron's float32 path (Triton's
interpreter and torch evaluate cos/sin alike; the products differ in order only). bfloat16: within one bf16 ulp
(rtol 2^-7, atol 1e-5) of Megatron's float32 result on the same bf16 inputs: the kernel computes in float32 and rounds
once (to nearest on a GPU; Triton 3.9's interpreter truncates float32 -> bf16, hence one ulp rather than half).
Megatron's own bf16 path rounds cos, sin and each product, and is not within one ulp of its float32 result.
Runtime: ~45 s on 2 cores (the interpreter runs each program in Python; the sm_90 compiles ~7 s).
"""

import logging

import pytest
import torch

triton = pytest.importorskip("triton", reason="triton is not installed (pip install '.[dev]')")

from megatron.core.models.common.embeddings.rope_utils import _apply_rotary_pos_emb_bshd  # noqa: E402
from megatron.core.transformer.attention import SelfAttention  # noqa: E402

from megatron_ext.kernels import rope  # noqa: E402
from megatron_ext.model import ModelConfig, build_model  # noqa: E402
from megatron_ext.positions import RopePositions, prope_inv_freq, rope_inv_freq  # noqa: E402
from megatron_ext.rope_attention import FusedRopeSelfAttention  # noqa: E402
from megatron_ext.rope_hook import rotary_angles  # noqa: E402
from pretrain.table import model_preset  # noqa: E402

S, B, HQ, HK, D = 6, 2, 4, 2, 16


@pytest.fixture
def interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _angles(positions: torch.Tensor, inv_freq: torch.Tensor, interleaved: bool = False) -> torch.Tensor:
    return rotary_angles(positions, inv_freq, interleaved=interleaved)


SHARED = torch.rand(S, generator=torch.Generator().manual_seed(1)) * 300
PER_SAMPLE = torch.rand(B, S, generator=torch.Generator().manual_seed(2)) * 300
CASES = {  # name: (angles, interleaved)
    "shared": (_angles(SHARED, rope_inv_freq(D, 10000.0)), False),
    "per_sample": (_angles(PER_SAMPLE, rope_inv_freq(D, 10000.0)), False),
    "per_sample_inv_freq": (_angles(SHARED, torch.rand(B, D // 2, generator=torch.Generator().manual_seed(3))),
                            False),
    "interleaved": (_angles(PER_SAMPLE, rope_inv_freq(D, 10000.0), interleaved=True), True),
    "p_rope": (_angles(PER_SAMPLE, prope_inv_freq(D, 10000.0, 0.25)), False),
    "partial_rotary": (_angles(PER_SAMPLE, rope_inv_freq(D // 2, 10000.0)), False),  # channels 8..16 pass through
    "partial_interleaved": (_angles(SHARED, rope_inv_freq(D // 2, 10000.0), interleaved=True), True),
}


def _qk(dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    # Views into one fused projection, as Megatron's q and k are: non-contiguous, last dim contiguous.
    g = torch.Generator().manual_seed(0)
    qkv = torch.randn(S, B, HK, (HQ // HK + 2) * D, generator=g).to(dtype)
    q, k, _ = torch.split(qkv, [HQ // HK * D, D, D], dim=3)
    return q.reshape(S, B, HQ, D).detach().requires_grad_(), k.detach().requires_grad_()


def _grads(q, k, q_out, k_out) -> tuple[torch.Tensor, torch.Tensor]:
    # bf16-representable output gradients, so the bf16 and float32 backward passes start from the same values
    g = torch.Generator().manual_seed(5)
    dq, dk = (torch.randn(t.shape, generator=g).bfloat16().to(t.dtype) for t in (q_out, k_out))
    return torch.autograd.grad((q_out, k_out), (q, k), (dq, dk))


def _megatron(q, k, angles, interleaved, mscale=1.0):
    return tuple(_apply_rotary_pos_emb_bshd(t, angles, rotary_interleaved=interleaved, mscale=mscale) for t in (q, k))


@pytest.mark.parametrize("case", sorted(CASES))
def test_float32_values_and_gradients_equal_megatrons_unfused_rope(interpreter, case):
    angles, interleaved = CASES[case]
    q, k = _qk()
    fused = rope.apply_rotary_qk(q, k, angles, interleaved=interleaved)
    unfused = _megatron(q, k, angles, interleaved)
    for ours, theirs in zip(fused + _grads(q, k, *fused), unfused + _grads(q, k, *unfused)):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["shared", "per_sample", "interleaved", "partial_rotary"])
def test_bfloat16_is_rounded_once_from_megatrons_float32_result(interpreter, case):
    angles, interleaved = CASES[case]
    q, k = _qk(torch.bfloat16)
    fused = rope.apply_rotary_qk(q, k, angles, interleaved=interleaved)
    q32, k32 = (t.detach().float().requires_grad_() for t in (q, k))
    exact = _megatron(q32, k32, angles, interleaved)
    assert all(t.dtype == torch.bfloat16 for t in fused)
    for ours, theirs in zip(fused + _grads(q, k, *fused), exact + _grads(q32, k32, *exact)):
        torch.testing.assert_close(ours.float(), theirs, rtol=2 ** -7, atol=1e-5)


def test_mscale_multiplies_cos_and_sin_as_megatron_does(interpreter):
    angles, _ = CASES["per_sample"]
    q, k = _qk()
    fused = rope.apply_rotary_qk(q, k, angles, mscale=1.3)
    unfused = _megatron(q, k, angles, False, mscale=1.3)
    for ours, theirs in zip(fused + _grads(q, k, *fused), unfused + _grads(q, k, *unfused)):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


def test_an_unused_output_contributes_no_gradient(interpreter):
    angles, _ = CASES["shared"]
    q, k = _qk()
    q_out, _ = rope.apply_rotary_qk(q, k, angles)
    (grad_q,) = torch.autograd.grad(q_out.sum(), q)
    (expected,) = torch.autograd.grad(_apply_rotary_pos_emb_bshd(q, angles).sum(), q)
    torch.testing.assert_close(grad_q, expected, rtol=1e-5, atol=1e-5)


def test_cpu_tensors_without_the_interpreter_are_refused_in_one_line(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q, k = _qk()
    with pytest.raises(ValueError, match="need TRITON_INTERPRET=1"):
        rope.apply_rotary_qk(q, k, CASES["shared"][0])


def test_angles_of_another_length_are_refused_naming_the_shapes(interpreter):
    q, k = _qk()
    with pytest.raises(ValueError, match=r"freqs \[5, 1, 1, 16\] is not"):
        rope.apply_rotary_qk(q, k, CASES["shared"][0][:5])


@pytest.mark.parametrize("interleaved,backward,rest", [(False, False, 0), (True, True, 32)])
def test_the_kernel_compiles_for_the_h200(interleaved, backward, rest):
    # The interpreter accepts more than the compiler: compile for sm_90 (no GPU needed up to the cubin).
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = triton.jit(rope._rope_qk_kernel)
    pointers = ["*bf16"] * 4 + ["*fp32"]
    signature = dict(zip(fn.arg_names, pointers + ["i32"] * 20 + ["fp32"] + ["constexpr"] * 7))
    constants = {"HALF": 32, "PASS": rest, "BLOCK_H": 16, "BLOCK_HALF": 32, "BLOCK_PASS": max(rest, 1),
                 "INTERLEAVED": interleaved, "BACKWARD": backward}
    source = ASTSource(fn=fn, signature=signature,
                       constexprs={(fn.arg_names.index(name),): value for name, value in constants.items()})
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"enable_fp_fusion": True})
    assert "cubin" in compiled.asm


# The kernel inside the model: Megatron's attention with FusedRopeSelfAttention against the unfused default.

TOKENS = torch.randint(0, 256, (B, 12), generator=torch.Generator().manual_seed(3))


def _logits_and_grads(rope_kernel: str, positions, **fields):
    torch.manual_seed(0)
    model = build_model(model_preset("tiny", rope_kernel=rope_kernel, **fields))
    logits = model(TOKENS, positions, None)
    (logits.float() ** 2).mean().backward()
    return model, logits.detach(), torch.cat([p.grad.flatten() for p in model.parameters()])


MODEL_CASES = {
    "per_sample": ({}, torch.sort(torch.rand(B, 12, generator=torch.Generator().manual_seed(1)) * 200).values),
    "per_layer": ({}, RopePositions(positions=torch.arange(12.0),
                                    layer_positions=torch.arange(12.0) * torch.tensor([[1.0], [2.5], [0.5], [4.0]]))),
    "interleaved_p_rope": (dict(rotary_interleaved=True, rope_proportion=0.5), torch.arange(12.0) * 3.7),
    # the long-context recipes: QK-norm before the rotation, local layers with their own base beside global ones
    "qk_norm_sliding_window_local_base": (dict(qk_layernorm=True, window_size=4, window_attn_skip_freq=2,
                                               rotary_base_local=500.0), torch.arange(12.0) * 2.0),
}


@pytest.mark.parametrize("case", sorted(MODEL_CASES))
def test_model_with_the_triton_kernel_equals_the_unfused_model(megatron_world, interpreter, case):
    fields, positions = MODEL_CASES[case]
    model, logits, grads = _logits_and_grads("triton", positions, **fields)
    assert all(type(layer.self_attention) is FusedRopeSelfAttention for layer in model.decoder.layers)
    _, logits_unfused, grads_unfused = _logits_and_grads("unfused", positions, **fields)
    torch.testing.assert_close(logits, logits_unfused, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grads, grads_unfused, rtol=1e-4, atol=1e-6)


def test_rope_kernel_auto_keeps_megatrons_attention_on_cpu(megatron_world, caplog):
    with caplog.at_level(logging.INFO, logger="megatron_ext.model"):
        model = build_model(model_preset("tiny"))
    assert ModelConfig().rope_kernel == "auto"
    assert all(type(layer.self_attention) is SelfAttention for layer in model.decoder.layers)
    assert "RoPE: layers 1,2,3,4 take Megatron's unfused RoPE" in caplog.text


def test_the_start_up_log_names_the_kernel_and_the_layers_without_rope(megatron_world, interpreter, caplog):
    with caplog.at_level(logging.INFO, logger="megatron_ext.model"):
        build_model(model_preset("tiny", rope_kernel="triton", no_rope_freq=2))
    assert ("RoPE: layers 1,3 take the fused Triton kernel (megatron_ext.kernels.rope), q and k in one launch; "
            "layers 2,4 have no RoPE (model.no_rope_freq)") in caplog.text


def test_rope_kernel_triton_on_cpu_without_the_interpreter_is_refused_in_one_line(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="model.rope_kernel=triton needs a CUDA GPU.*use model.rope_kernel=auto"):
        build_model(model_preset("tiny", rope_kernel="triton"))


def test_an_unknown_rope_kernel_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="model.rope_kernel must be one of"):
        ModelConfig(rope_kernel="flash")


def test_train_refuses_rope_kernel_triton_without_a_gpu_in_one_line_with_exit_2(monkeypatch, capsys):
    from pretrain.trainer.cli import main

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert main(["--check", "--set", "preset=tiny", "data.synthetic=true", "model.rope_kernel=triton"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "model.rope_kernel=triton needs a CUDA GPU" in err


def test_a_forward_that_never_asks_for_q_and_k_fails_instead_of_skipping_rope(megatron_world, interpreter,
                                                                            monkeypatch):
    # what a megatron-core whose forward stopped calling get_query_key_value_tensors would do
    model = build_model(model_preset("tiny", rope_kernel="triton"))
    attention = model.decoder.layers[0].self_attention
    monkeypatch.setattr(attention, "get_query_key_value_tensors",
                        lambda *a, **k: SelfAttention.get_query_key_value_tensors(attention, *a, **k))
    with pytest.raises(RuntimeError, match="rotated nothing: use model.rope_kernel=unfused"):
        model(TOKENS, torch.arange(12.0), None)
