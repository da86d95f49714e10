"""RoPE inverse frequencies and frequency transforms (PI, NTK, dynamic NTK, YaRN, Llama 3).

The formulas follow Hugging Face transformers' `ROPE_INIT_FUNCTIONS` ('linear',
'dynamic', 'yarn', 'llama3') so that a model trained here and evaluated with an HF-style
rope_scaling config sees the same frequencies (tests compare within 1e-6).

Every kind is a change of the inverse frequencies (plus YaRN's attention factor), never of
the positions: a float position p (PosAug α·i, RFS, ...) is rotated by p · inv_freq, which is
how transformers composes a rope type with its position_ids. 'llama3' is also a property of
a model (Llama 3.1/3.2 are trained with it): megatron_ext.model applies it to the model's
own frequencies when model.use_rope_scaling is set.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where frequencies are computed: a config check needs only the vocabulary
    import torch

# The one vocabulary of inference-time RoPE scaling: config fields, CLI choices, scorers and
# the HF export all use these names.
ROPE_SCALING_KINDS = ("none", "pi", "ntk", "dynamic_ntk", "yarn", "llama3")
# Hugging Face names accepted on input (the export CLI took them before).
ROPE_SCALING_ALIASES = {"linear": "pi", "dynamic": "dynamic_ntk", "default": "none"}
# How each kind is written in a Hugging Face Llama config (transformers' rope_type). Static NTK has
# no rope_type of its own: it is a change of base, exported as rope_theta with the default type.
HF_ROPE_TYPE = {"none": "default", "pi": "linear", "ntk": "default", "dynamic_ntk": "dynamic", "yarn": "yarn",
                "llama3": "llama3"}


def scaling_kind(name: str | None) -> str:
    """Canonical kind of `name` (an HF alias is accepted); ValueError lists the choices."""
    kind = ROPE_SCALING_ALIASES.get(name or "none", name or "none")
    if kind not in ROPE_SCALING_KINDS:
        raise ValueError(f"rope scaling must be one of {', '.join(ROPE_SCALING_KINDS)} "
                         f"(or the HF names {', '.join(ROPE_SCALING_ALIASES)}); got {name!r}")
    return kind


def rope_inv_freq(rotary_dim: int, base: float, device: torch.device | str | None = None) -> torch.Tensor:
    """Standard RoPE inverse frequencies base ** (-arange(0, d, 2) / d), float32 [d // 2]."""
    import torch

    if rotary_dim <= 0 or rotary_dim % 2:
        raise ValueError(f"rotary_dim must be a positive even integer (got {rotary_dim})")
    if not base > 0:
        raise ValueError(f"rotary base must be > 0 (got {base})")
    # Written exactly like Megatron's RotaryEmbedding (and HF) so that the
    # unscaled result is bit-identical to the model's own buffer.
    exponent = torch.arange(0, rotary_dim, 2, dtype=torch.float32, device=device) / rotary_dim
    return 1.0 / (base**exponent)


@dataclass
class RopeScaling:
    """Frequency transform: kind in ROPE_SCALING_KINDS (with its HF parameters)."""

    kind: str = "none"
    # None -> max(1, seq_len / original_max_position_embeddings); for dynamic_ntk
    # None means 1.0 because HF's dynamic formula already grows with seq_len.
    factor: float | None = None
    original_max_position_embeddings: int | None = None  # the training window w
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    # llama3 only: wavelengths below original / high_freq_factor keep their frequency, those above
    # original / low_freq_factor are divided by the factor, the band between is interpolated.
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0

    def __post_init__(self) -> None:
        if self.kind not in ROPE_SCALING_KINDS:
            raise ValueError(f"rope_scaling kind must be one of {ROPE_SCALING_KINDS} (got {self.kind!r})")
        if self.factor is not None and not self.factor >= 1.0:
            raise ValueError(f"rope_scaling factor must be >= 1 (got {self.factor})")
        if self.original_max_position_embeddings is not None and self.original_max_position_embeddings < 1:
            raise ValueError(
                "rope_scaling original_max_position_embeddings must be >= 1 "
                f"(got {self.original_max_position_embeddings})"
            )
        if not 0 < self.beta_slow < self.beta_fast:
            raise ValueError(
                f"rope_scaling needs 0 < beta_slow < beta_fast (got beta_slow={self.beta_slow}, "
                f"beta_fast={self.beta_fast})"
            )
        if not 0 < self.low_freq_factor < self.high_freq_factor:
            raise ValueError(
                "rope_scaling needs 0 < low_freq_factor < high_freq_factor "
                f"(got low_freq_factor={self.low_freq_factor}, high_freq_factor={self.high_freq_factor})"
            )

    def resolve_factor(self, seq_len: int) -> float:
        """The scale s: the explicit factor, or max(1, seq_len / original window)."""
        if self.factor is not None:
            return float(self.factor)
        if self.kind == "dynamic_ntk":
            return 1.0
        if self.original_max_position_embeddings is None:
            raise ValueError(
                f"rope_scaling {self.kind!r} without a factor needs original_max_position_embeddings "
                "(the training sequence length) to derive factor = eval_len / train_len"
            )
        return max(1.0, seq_len / self.original_max_position_embeddings)


def yarn_attention_factor(factor: float) -> float:
    """YaRN mscale 0.1 * ln(s) + 1 (multiplies cos and sin, so logits scale by its square)."""
    return 1.0 if factor <= 1.0 else 0.1 * math.log(factor) + 1.0


def _yarn_inv_freq(rotary_dim: int, base: float, factor: float, original_len: int,
                   beta_fast: float, beta_slow: float, device) -> torch.Tensor:
    """NTK-by-parts frequencies, written to match transformers' _compute_yarn_parameters (truncate=True)."""
    import torch

    def correction_dim(num_rotations: float) -> float:
        # The dimension whose wavelength fits `num_rotations` times in the original window.
        return rotary_dim * math.log(original_len / (num_rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), rotary_dim - 1)
    if low == high:
        high += 0.001  # same guard as HF against a zero-width ramp
    ramp = ((torch.arange(rotary_dim // 2, dtype=torch.float32, device=device) - low) / (high - low)).clamp(0, 1)
    extrapolation = rope_inv_freq(rotary_dim, base, device)
    interpolation = extrapolation / factor
    keep = 1 - ramp  # 1 -> keep the original (high-frequency) dims, 0 -> interpolate
    return interpolation * (1 - keep) + extrapolation * keep


def llama3_inv_freq(inv_freq: torch.Tensor, factor: float, original_len: int,
                    low_freq_factor: float, high_freq_factor: float) -> torch.Tensor:
    """Llama 3.1's frequency-dependent scaling of `inv_freq`, written like transformers' _compute_llama3_parameters."""
    import torch

    low_freq_wavelen = original_len / low_freq_factor
    high_freq_wavelen = original_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (original_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def scaled_inv_freq(
    rotary_dim: int,
    base: float,
    scaling: RopeScaling,
    seq_len: int,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, float]:
    """(inv_freq, attention_factor) of `scaling` applied to RoPE(rotary_dim, base) at length seq_len."""
    kind = scaling.kind
    if kind == "none":
        return rope_inv_freq(rotary_dim, base, device), 1.0
    s = scaling.resolve_factor(seq_len)
    if kind == "pi":
        # Dividing frequencies by s == dividing positions by s (Chen et al. 2023).
        return rope_inv_freq(rotary_dim, base, device) / s, 1.0
    if kind == "ntk":
        return rope_inv_freq(rotary_dim, base * s ** (rotary_dim / (rotary_dim - 2)), device), 1.0
    if kind == "dynamic_ntk":
        original = scaling.original_max_position_embeddings
        if original is None:
            raise ValueError("rope_scaling 'dynamic_ntk' needs original_max_position_embeddings")
        length = max(seq_len, original)  # HF: no change at or below the training window
        new_base = base * ((s * length / original) - (s - 1)) ** (rotary_dim / (rotary_dim - 2))
        return rope_inv_freq(rotary_dim, new_base, device), 1.0
    if kind == "yarn":
        original = scaling.original_max_position_embeddings
        if original is None:
            raise ValueError("rope_scaling 'yarn' needs original_max_position_embeddings")
        inv_freq = _yarn_inv_freq(rotary_dim, base, s, original, scaling.beta_fast, scaling.beta_slow, device)
        return inv_freq, yarn_attention_factor(s)
    if kind == "llama3":
        original = scaling.original_max_position_embeddings
        if original is None:
            raise ValueError("rope_scaling 'llama3' needs original_max_position_embeddings")
        return llama3_inv_freq(rope_inv_freq(rotary_dim, base, device), s, original, scaling.low_freq_factor,
                               scaling.high_freq_factor), 1.0
    raise AssertionError(f"unhandled rope scaling kind {kind!r}")  # guarded by __post_init__
