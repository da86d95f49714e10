"""Fused RoPE for float positions: q and k rotated by one Triton launch, forward and backward.

Layout contract (Megatron-Core's sbhd, what `_apply_rotary_pos_emb_bshd` receives from attention):
- q [s, b, hq, d] and k [s, b, hk, d], any dtype, any strides with the last dimension contiguous (Megatron's q/k
  are views into the fused qkv projection, so they are not contiguous; nothing is copied to make them so);
- freqs [s, 1, 1, r] (angles shared by the batch) or [s, b, 1, r] (per sample), float32, r even and r <= d: the
  angles megatron_ext.rope_hook builds from float positions (per-layer rows already picked for this layer);
  channels r..d pass through unrotated (partial rotary); a zero angle (p-RoPE's removed frequencies) leaves its
  pair as it is, as in the reference;
- non-interleaved: channel j pairs with j + r/2 and uses angles freqs[j] and freqs[j + r/2]; interleaved
  (model.rotary_interleaved): channel 2i pairs with 2i + 1, angles freqs[2i] and freqs[2i + 1];
- mscale multiplies cos and sin (YaRN's attention factor in Megatron's signature; this project applies YaRN's
  factor through the core attention's softmax_scale instead, see megatron_ext.rope_hook, and passes 1).
Outputs are new contiguous tensors [s, b, h, d] in the input dtype; angles get no gradient. The kernel computes in
float32 and rounds once, so in bf16 it is as close to float32 as the unfused path or closer (that path rounds
cos/sin and each product to bf16).

The reference below is the same math in torch, pair by pair (Megatron's `_rotate_half` form, written for any
angle table, duplicated halves or not).
"""

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the dev extra and CUDA torch bring it; callers check `available()`
    triton = tl = None


def rope_reference(t: torch.Tensor, freqs: torch.Tensor, *, interleaved: bool = False,
                   mscale: float = 1.0) -> torch.Tensor:
    """t [s, b, h, d] rotated by freqs [s, b|1, 1, r] in float32, rounded once to t's dtype."""
    rot = freqs.shape[-1]
    x, rest = t[..., :rot].float(), t[..., rot:]
    first, second = (slice(0, None, 2), slice(1, None, 2)) if interleaved else \
        (slice(0, rot // 2), slice(rot // 2, rot))
    f1, f2 = freqs[..., first].float(), freqs[..., second].float()
    x1, x2 = x[..., first], x[..., second]
    y1 = x1 * torch.cos(f1) * mscale - x2 * torch.sin(f1) * mscale
    y2 = x2 * torch.cos(f2) * mscale + x1 * torch.sin(f2) * mscale
    y = torch.stack((y1, y2), dim=-1).flatten(-2) if interleaved else torch.cat((y1, y2), dim=-1)
    return torch.cat((y.to(t.dtype), rest), dim=-1)


if tl is not None:
    def _rope_qk_kernel(
        q_ptr, k_ptr, qo_ptr, ko_ptr, f_ptr,
        q_ss, q_sb, q_sh, k_ss, k_sb, k_sh,
        qo_ss, qo_sb, qo_sh, ko_ss, ko_sb, ko_sh,
        f_ss, f_sb, batch, heads_q, heads_k, mscale,
        HALF: tl.constexpr, PASS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
        BLOCK_PASS: tl.constexpr, INTERLEAVED: tl.constexpr, BACKWARD: tl.constexpr,
    ):
        # One program per (position, sample): the angles' cos/sin are computed once for every head of q and k.
        row = tl.program_id(0)
        s = (row // batch).to(tl.int64)
        b = (row % batch).to(tl.int64)
        pair = tl.arange(0, BLOCK_HALF)
        in_pair = pair < HALF
        if INTERLEAVED:
            first = 2 * pair
            second = 2 * pair + 1
        else:
            first = pair
            second = pair + HALF
        f_row = f_ptr + s * f_ss + b * f_sb
        f1 = tl.load(f_row + first, mask=in_pair, other=0.0).to(tl.float32)
        f2 = tl.load(f_row + second, mask=in_pair, other=0.0).to(tl.float32)
        c1 = (tl.cos(f1) * mscale)[None, :]
        s1 = (tl.sin(f1) * mscale)[None, :]
        c2 = (tl.cos(f2) * mscale)[None, :]
        s2 = (tl.sin(f2) * mscale)[None, :]
        j1 = first[None, :]
        j2 = second[None, :]
        h = tl.arange(0, BLOCK_H)[:, None].to(tl.int64)
        p = 2 * HALF + tl.arange(0, BLOCK_PASS)[None, :]

        # q (the same lines as k below: a nested jit function would tie this module to one Triton mode)
        m = (h < heads_q) & in_pair[None, :]
        x_row = q_ptr + s * q_ss + b * q_sb + h * q_sh
        o_row = qo_ptr + s * qo_ss + b * qo_sb + h * qo_sh
        x1 = tl.load(x_row + j1, mask=m, other=0.0).to(tl.float32)
        x2 = tl.load(x_row + j2, mask=m, other=0.0).to(tl.float32)
        if BACKWARD:  # the transpose: for equal angles, a rotation by -θ
            y1 = x1 * c1 + x2 * s2
            y2 = x2 * c2 - x1 * s1
        else:
            y1 = x1 * c1 - x2 * s1
            y2 = x2 * c2 + x1 * s2
        tl.store(o_row + j1, y1.to(qo_ptr.dtype.element_ty), mask=m)
        tl.store(o_row + j2, y2.to(qo_ptr.dtype.element_ty), mask=m)
        if PASS > 0:
            mp = (h < heads_q) & (p < 2 * HALF + PASS)
            tl.store(o_row + p, tl.load(x_row + p, mask=mp, other=0.0), mask=mp)

        # k
        m = (h < heads_k) & in_pair[None, :]
        x_row = k_ptr + s * k_ss + b * k_sb + h * k_sh
        o_row = ko_ptr + s * ko_ss + b * ko_sb + h * ko_sh
        x1 = tl.load(x_row + j1, mask=m, other=0.0).to(tl.float32)
        x2 = tl.load(x_row + j2, mask=m, other=0.0).to(tl.float32)
        if BACKWARD:
            y1 = x1 * c1 + x2 * s2
            y2 = x2 * c2 - x1 * s1
        else:
            y1 = x1 * c1 - x2 * s1
            y2 = x2 * c2 + x1 * s2
        tl.store(o_row + j1, y1.to(ko_ptr.dtype.element_ty), mask=m)
        tl.store(o_row + j2, y2.to(ko_ptr.dtype.element_ty), mask=m)
        if PASS > 0:
            mp = (h < heads_k) & (p < 2 * HALF + PASS)
            tl.store(o_row + p, tl.load(x_row + p, mask=mp, other=0.0), mask=mp)

_JITTED: dict = {}


def available() -> bool:
    """True when Triton is importable."""
    return triton is not None


def interpreting() -> bool:
    """True when Triton would run kernels through its CPU interpreter (TRITON_INTERPRET=1)."""
    return triton is not None and bool(triton.knobs.runtime.interpret)


def _kernel():
    """The kernel, jitted for the Triton mode of this moment (interpreter or compiler)."""
    mode = interpreting()
    if mode not in _JITTED:
        _JITTED[mode] = triton.jit(_rope_qk_kernel)
    return _JITTED[mode]


def unsupported(q: torch.Tensor, k: torch.Tensor, freqs: torch.Tensor) -> str | None:
    """Why the kernel cannot take these tensors (None when it can): the layout contract of this module."""
    if triton is None:
        return "triton is not installed"
    if q.dim() != 4 or k.dim() != 4 or freqs.dim() != 4:
        return f"needs q, k [s, b, h, d] and freqs [s, b|1, 1, r] (got {list(q.shape)}, {list(k.shape)}, " \
               f"{list(freqs.shape)})"
    s, b, _, d = q.shape
    if k.shape[0] != s or k.shape[1] != b or k.shape[3] != d:
        return f"q {list(q.shape)} and k {list(k.shape)} differ in s, b or d"
    if freqs.shape[0] != s or freqs.shape[1] not in (1, b) or freqs.shape[2] != 1:
        return f"freqs {list(freqs.shape)} is not [s, 1, 1, r] or [s, b, 1, r] for q {list(q.shape)}"
    rot = freqs.shape[-1]
    if rot % 2 or rot > d or rot == 0:
        return f"rotary dim {rot} must be even, positive and <= head dim {d}"
    if q.dtype != k.dtype:
        return f"q ({q.dtype}) and k ({k.dtype}) differ in dtype"
    if freqs.requires_grad:
        return "freqs requires grad (the kernel gives angles no gradient)"
    if not (q.device == k.device == freqs.device):
        return "q, k and freqs are on different devices"
    if q.device.type != "cuda" and not interpreting():
        return f"tensors on {q.device.type} need TRITON_INTERPRET=1 (Triton compiles for CUDA only)"
    return None


def _launch(q: torch.Tensor, k: torch.Tensor, freqs: torch.Tensor, interleaved: bool, mscale: float,
            backward: bool) -> tuple[torch.Tensor, torch.Tensor]:
    q, k, freqs = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, freqs))
    s, b, hq, d = q.shape
    hk = k.shape[2]
    rot = freqs.shape[-1]
    qo = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    ko = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    if q.numel() == 0:
        return qo, ko
    f_sb = freqs.stride(1) if freqs.shape[1] > 1 else 0
    pass_ = d - rot
    _kernel()[(s * b,)](
        q, k, qo, ko, freqs,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        qo.stride(0), qo.stride(1), qo.stride(2), ko.stride(0), ko.stride(1), ko.stride(2),
        freqs.stride(0), f_sb, b, hq, hk, float(mscale),
        HALF=rot // 2, PASS=pass_, BLOCK_H=triton.next_power_of_2(max(hq, hk)),
        BLOCK_HALF=triton.next_power_of_2(rot // 2), BLOCK_PASS=triton.next_power_of_2(max(pass_, 1)),
        INTERLEAVED=bool(interleaved), BACKWARD=backward,
        enable_fp_fusion=True,  # FMAs, as Triton 3.9 defaults to; said explicitly, so it does not warn per process
    )
    return qo, ko


class _RopeQK(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, freqs, interleaved, mscale):
        ctx.save_for_backward(freqs)
        ctx.interleaved, ctx.mscale = interleaved, mscale
        ctx.shapes = (q.shape, k.shape, q.dtype, q.device)
        return _launch(q, k, freqs, interleaved, mscale, backward=False)

    @staticmethod
    def backward(ctx, grad_q, grad_k):
        (freqs,) = ctx.saved_tensors
        # An output nobody used gets no gradient from autograd; it contributes zero.
        q_shape, k_shape, dtype, device = ctx.shapes
        grad_q = torch.zeros(q_shape, dtype=dtype, device=device) if grad_q is None else grad_q
        grad_k = torch.zeros(k_shape, dtype=dtype, device=device) if grad_k is None else grad_k
        dq, dk = _launch(grad_q, grad_k, freqs, ctx.interleaved, ctx.mscale, backward=True)
        return dq, dk, None, None, None


def apply_rotary_qk(q: torch.Tensor, k: torch.Tensor, freqs: torch.Tensor, *, interleaved: bool = False,
                    mscale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, k) rotated by freqs in one launch (and one in backward); ValueError naming what breaks the contract."""
    reason = unsupported(q, k, freqs)
    if reason is not None:
        raise ValueError(f"fused RoPE kernel: {reason}")
    return _RopeQK.apply(q, k, freqs, bool(interleaved), float(mscale))
