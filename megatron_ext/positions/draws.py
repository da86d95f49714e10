"""`PositionDraws`: every random draw a `PositionSampler` makes (PosAug's α and its curriculum, random_base's
RoPE base, the uniforms each strategy turns into positions); how draws become positions: sampler.py.

Randomness contract (see rng.py): every draw is a pure function of the seed, the
optimizer step and, for per-sample draws, the sequence's index in the step's global
batch. Nothing depends on TP/PP/DP/CP sizes, micro-batch size or the number of
microbatches, so a run draws the same positions for the same sequence in any parallel
layout; all ranks agree without communication; a restarted run reproduces them.

Cost contract: per-step scalars (alpha, RoPE base) are drawn with a CPU generator, which
never waits on the accelerator; uniforms for positions are drawn on the requested device.
Per-sample draws cost one generator and one small RNG call per sequence of the microbatch
(O(micro_batch_size) kernel launches).
"""

from __future__ import annotations

import math

import torch

from .config import PositionConfig
from .rng import PER_STEP, STREAM_ALPHA, STREAM_BASE, STREAM_LAYER_ALPHA, STREAM_POSITIONS, position_generator
from .scaling import rope_inv_freq


def as_device(device: torch.device | str | None) -> torch.device:
    """`device` as a torch.device (None: the CPU)."""
    return torch.device("cpu") if device is None else torch.device(device)


class PositionDraws:
    """The keyed random draws of a position config: per step, or per global sample index."""

    def __init__(self, config: PositionConfig, *, seed: int, num_layers: int, rotary_dim: int, rotary_base: float,
                 total_steps: int) -> None:
        self.config = config
        self.seed = int(seed)
        self.num_layers = int(num_layers)
        self.rotary_dim = int(rotary_dim)
        self.rotary_base = float(rotary_base)
        self.total_steps = int(total_steps)
        # Small constant tables copied to each device once (a host->device copy
        # synchronises, so it must not happen every step).
        self._device_tables: dict[tuple[str, torch.device], torch.Tensor] = {}

    # ------------------------------------------------------------ per-step scalars

    def alpha_range(self, step: int) -> tuple[float, float]:
        """[lo, hi] of the PosAug alpha distribution at `step` (after the linear curriculum)."""
        cfg = self.config
        if cfg.curriculum != "linear":
            return cfg.alpha_min, cfg.alpha_max
        t = min(1.0, max(0.0, step / max(1, self.total_steps - 1)))
        lo = cfg.curriculum_start_min + t * (cfg.alpha_min - cfg.curriculum_start_min)
        hi = cfg.curriculum_start_max + t * (cfg.alpha_max - cfg.curriculum_start_max)
        return lo, hi

    def in_warmup(self, step: int) -> bool:
        """True while the step curriculum keeps alpha = 1."""
        cfg = self.config
        return cfg.curriculum == "step" and step < cfg.curriculum_fraction * self.total_steps

    def sample_alpha(self, step: int) -> float:
        """The per_step PosAug alpha of optimizer step `step` (shared by the whole global batch)."""
        cfg = self.config
        if self.in_warmup(step):
            return 1.0
        if cfg.alpha_distribution == "fixed":
            return cfg.alpha_fixed
        if cfg.alpha_distribution == "cycle":
            return cfg.alpha_values[step % len(cfg.alpha_values)]
        # CPU generator: drawing a Python scalar never syncs with the accelerator.
        u = torch.rand((), generator=position_generator(self.seed, step, PER_STEP, "cpu", STREAM_ALPHA),
                       dtype=torch.float64).item()
        return self._alpha_from_uniform(u, step)

    def sample_alphas(self, step: int, samples: range, device: torch.device | str | None = None) -> torch.Tensor:
        """Per_sample PosAug alphas [len(samples)] of step `step` for the given global sample indices."""
        device = as_device(device)
        cfg = self.config
        if self.in_warmup(step):
            return torch.ones(len(samples), device=device)
        if cfg.alpha_distribution == "fixed":
            return torch.full((len(samples),), cfg.alpha_fixed, device=device)
        return self._alpha_from_uniform(self._uniforms(step, samples, 1, STREAM_ALPHA, device)[:, 0], step)

    def sample_layer_alphas(self, step: int, device: torch.device | str | None = None,
                            samples: range | None = None) -> torch.Tensor:
        """Independent per-layer alphas of step `step`: [num_layers], or [num_layers, len(samples)] per sample."""
        device = as_device(device)
        shape = (self.num_layers,) if samples is None else (self.num_layers, len(samples))
        if self.in_warmup(step):
            return torch.ones(shape, device=device)
        u = self._uniforms(step, samples, self.num_layers, STREAM_LAYER_ALPHA, device)
        return self._alpha_from_uniform(u.movedim(-1, 0), step)

    def sample_base(self, step: int) -> float:
        """The per_step random_base RoPE base of step `step`: U[min_factor * B0, max_factor * B0]."""
        cfg = self.config
        u = torch.rand((), generator=position_generator(self.seed, step, PER_STEP, "cpu", STREAM_BASE),
                       dtype=torch.float64).item()
        return self.rotary_base * (cfg.base_min_factor + u * (cfg.base_max_factor - cfg.base_min_factor))

    # -------------------------------------------------------------------- helpers

    def _uniforms(self, step: int, samples: range | None, n: int, stream: int,
                  device: torch.device) -> torch.Tensor:
        """U[0, 1) draws: [n] from the step's generator, or [len(samples), n], row i from sample samples[i]'s."""
        if samples is None:
            generator = position_generator(self.seed, step, PER_STEP, device, stream)
            return torch.rand(n, generator=generator, device=device)
        # One generator per sequence: row i depends only on (seed, step, global index), never on
        # which rank or microbatch holds the sequence.
        return torch.stack([
            torch.rand(n, generator=position_generator(self.seed, step, sample, device, stream), device=device)
            for sample in samples])

    def _alpha_from_uniform(self, u, step: int):
        """Map u ~ U[0, 1) (float or tensor) to alpha under the configured distribution."""
        cfg = self.config
        if cfg.alpha_distribution == "discrete":
            n = len(cfg.alpha_values)
            if isinstance(u, torch.Tensor):
                return self._table("alpha_values", u.device)[(u * n).long().clamp_(max=n - 1)]
            return cfg.alpha_values[min(int(u * n), n - 1)]
        lo, hi = self.alpha_range(step)
        if cfg.alpha_distribution == "log_uniform":
            log_lo, log_hi = math.log(lo), math.log(hi)
            scaled = log_lo + u * (log_hi - log_lo)
            return torch.exp(scaled) if isinstance(scaled, torch.Tensor) else math.exp(scaled)
        return lo + u * (hi - lo)

    def _table(self, name: str, device: torch.device) -> torch.Tensor:
        key = (name, device)
        if key not in self._device_tables:
            self._device_tables[key] = torch.tensor(getattr(self.config, name), dtype=torch.float32, device=device)
        return self._device_tables[key]

    def _random_inv_freq(self, step: int, samples: range | None, device: torch.device) -> torch.Tensor:
        """random_base inverse frequencies: [d/2] per step, or [b, d/2] (one base per sequence)."""
        if samples is None:
            return rope_inv_freq(self.rotary_dim, self.sample_base(step), device)
        cfg = self.config
        u = self._uniforms(step, samples, 1, STREAM_BASE, device)
        bases = self.rotary_base * (cfg.base_min_factor + u * (cfg.base_max_factor - cfg.base_min_factor))
        exponent = torch.arange(0, self.rotary_dim, 2, dtype=torch.float32, device=device) / self.rotary_dim
        return 1.0 / bases**exponent

    def _document_draws(self, step: int, samples: range | None, seq_len: int, device: torch.device) -> torch.Tensor:
        """Warp's (kind, head α) uniforms per document ordinal: [s, 2] (per step) or [b, s, 2].

        Document 0 takes the generator's first two draws, which the plain path takes, so a window
        with one document is warped exactly as without document masking."""
        def draws(sample: int) -> torch.Tensor:
            generator = position_generator(self.seed, step, sample, device, STREAM_POSITIONS)
            first = torch.rand(2, generator=generator, device=device)
            rest = torch.rand(2 * (seq_len - 1), generator=generator, device=device)
            return torch.cat([first, rest]).view(seq_len, 2)

        if samples is None:
            return draws(PER_STEP)
        return torch.stack([draws(sample) for sample in samples])
