"""`PositionSampler`: turns a `PositionConfig` into per-microbatch `RopePositions`.

Randomness contract (see rng.py): every draw is a pure function of
(seed, step, microbatch, stream), so all parallel ranks agree without
communication and a restarted run reproduces the same positions.

Cost contract: position tensors are built on the requested device with a
handful of tensor ops; per-step scalars (alpha, RoPE base) are drawn with a CPU
generator, which never waits on the accelerator. Nothing in `training` reads a
device tensor back to the host.
"""

from __future__ import annotations

import math

import torch

from . import strategies
from .config import PositionConfig
from .rng import (PER_STEP, STREAM_ALPHA, STREAM_BASE, STREAM_EVAL, STREAM_LAYER_ALPHA,
                  STREAM_POSITIONS, position_generator)
from .rope_positions import RopePositions
from .scaling import RopeScaling, rope_inv_freq, scaled_inv_freq


def _device(device: torch.device | str | None) -> torch.device:
    return torch.device("cpu") if device is None else torch.device(device)


class PositionSampler:
    """Builds RoPE positions for training microbatches and for evaluation."""

    def __init__(self, config: PositionConfig, *, seed: int, train_seq_len: int, num_layers: int,
                 rotary_dim: int, rotary_base: float, total_steps: int) -> None:
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1 (got {num_layers})")
        if rotary_dim < 2 or rotary_dim % 2:
            raise ValueError(f"rotary_dim must be a positive even integer (got {rotary_dim})")
        if not rotary_base > 0:
            raise ValueError(f"rotary_base must be > 0 (got {rotary_base})")
        if total_steps < 1:
            raise ValueError(f"total_steps must be >= 1 (got {total_steps})")
        config.validate_for(train_seq_len)
        if config.layer_mode in ("bottom", "top") and config.layer_count > num_layers:
            raise ValueError(
                f"positions.layer_count must be <= num_layers={num_layers} with "
                f"positions.layer_mode={config.layer_mode} (got {config.layer_count})"
            )
        self.config = config
        self.seed = int(seed)
        self.train_seq_len = int(train_seq_len)
        self.num_layers = int(num_layers)
        self.rotary_dim = int(rotary_dim)
        self.rotary_base = float(rotary_base)
        self.total_steps = int(total_steps)
        # Small constant tables copied to each device once (a host->device copy
        # synchronises, so it must not happen every step).
        self._device_tables: dict[tuple[str, torch.device], torch.Tensor] = {}

    # ------------------------------------------------------------------ public API

    @property
    def needs_per_sample(self) -> bool:
        """True when positions are [b, s] and `training` needs batch_size."""
        cfg = self.config
        return cfg.strategy == "warp" or (cfg.strategy in ("rfs", "rpe") and cfg.per_sample)

    def training(self, step: int, microbatch: int, seq_len: int, batch_size: int | None = None,
                 device: torch.device | str | None = None) -> RopePositions:
        """Positions for microbatch `microbatch` of optimizer step `step`."""
        if step < 0:
            raise ValueError(f"step must be >= 0 (got {step})")
        if microbatch < 0:
            raise ValueError(f"microbatch must be >= 0 (got {microbatch}); -1 is reserved for per-step draws")
        if seq_len < 1:
            raise ValueError(f"seq_len must be >= 1 (got {seq_len})")
        if self.needs_per_sample and (batch_size is None or batch_size < 1):
            raise ValueError(
                f"strategy {self.config.strategy!r} draws positions per sample: pass batch_size >= 1 "
                f"(got {batch_size})"
            )
        device = _device(device)
        strategy = self.config.strategy
        if strategy == "none":
            return RopePositions(strategies.scaled_positions(seq_len, 1.0, device))
        if strategy == "posaug":
            return self._posaug(step, seq_len, device)
        if strategy == "random_base":
            base = self.sample_base(step)
            return RopePositions(strategies.scaled_positions(seq_len, 1.0, device),
                                 inv_freq=rope_inv_freq(self.rotary_dim, base, device))
        shape = (batch_size, seq_len) if self.needs_per_sample else (seq_len,)
        generator = position_generator(self.seed, step, microbatch, device, STREAM_POSITIONS)
        if strategy == "rfs":
            return RopePositions(strategies.rfs_train_positions(shape, self.config.max_position, generator, device))
        if strategy == "rpe":
            self.config.validate_for(seq_len)
            return RopePositions(strategies.rpe_positions(shape, self.config.max_position, generator, device))
        if strategy == "warp":
            cfg = self.config
            head_alphas = None if cfg.head_alpha_fixed is not None else self._table("head_alphas", device)
            positions = strategies.warp_positions(
                batch_size, seq_len, p_head=cfg.p_head, p_tail=cfg.p_tail, head_alphas=head_alphas,
                head_alpha_fixed=cfg.head_alpha_fixed, tail_function=cfg.tail_function,
                generator=generator, device=device)
            return RopePositions(positions)
        raise AssertionError(f"unhandled strategy {strategy!r}")  # guarded by PositionConfig

    def evaluation(self, seq_len: int, device: torch.device | str | None = None) -> RopePositions:
        """Deterministic positions for evaluating at `seq_len`, plus positions.rope_scaling on top."""
        if seq_len < 1:
            raise ValueError(f"seq_len must be >= 1 (got {seq_len})")
        device = _device(device)
        cfg = self.config
        if cfg.strategy == "rfs":
            positions = strategies.rfs_eval_positions(seq_len, self.train_seq_len, cfg.max_position, device)
        elif cfg.strategy == "rpe":
            # Ruoss et al. evaluate with the same random procedure; a fixed eval
            # stream makes every evaluation of a run use the same positions.
            cfg.validate_for(seq_len)
            generator = position_generator(self.seed, PER_STEP, PER_STEP, device, STREAM_EVAL)
            positions = strategies.rpe_positions((seq_len,), cfg.max_position, generator, device)
        elif cfg.strategy == "warp":
            # The warping paper evaluates with PI at ratio train_len / eval_len
            # (never stretching positions when evaluating at or below train_len).
            positions = strategies.scaled_positions(seq_len, min(1.0, self.train_seq_len / seq_len), device)
        else:
            # none, posaug (alpha = 1) and random_base (the model's own base).
            positions = strategies.scaled_positions(seq_len, 1.0, device)
        if cfg.rope_scaling == "none":
            return RopePositions(positions)
        scaling = RopeScaling(kind=cfg.rope_scaling, factor=cfg.rope_scaling_factor,
                              original_max_position_embeddings=self.train_seq_len)
        inv_freq, attention_factor = scaled_inv_freq(self.rotary_dim, self.rotary_base, scaling, seq_len, device)
        return RopePositions(positions, inv_freq=inv_freq, attention_factor=attention_factor)

    def stats(self, rope: RopePositions) -> dict[str, float]:
        """Scalars for logging (alpha, max_position, min_gap, mean_gap, ...); syncs with the device."""
        grid = rope.layer_positions if rope.layer_positions is not None else rope.positions
        values: dict[str, torch.Tensor] = {"max_position": grid.max()}
        if grid.shape[-1] > 1:
            gaps = grid.diff(dim=-1)
            values["min_gap"] = gaps.min()
            values["mean_gap"] = gaps.mean()
            if self.config.strategy == "posaug":
                # PosAug rows are alpha * arange, so the first gap of a row is its alpha.
                row_alpha = grid[..., 1] - grid[..., 0]
                if rope.layer_positions is None:
                    values["alpha"] = row_alpha
                elif self.config.layer_mode == "independent":
                    values["alpha"] = row_alpha.mean()
                    values["alpha_min"] = row_alpha.min()
                    values["alpha_max"] = row_alpha.max()
                else:
                    # The scaled rows: first layer_count (bottom) or last (top).
                    values["alpha"] = row_alpha[0] if self.config.layer_mode == "bottom" else row_alpha[-1]
        if rope.inv_freq is not None and rope.inv_freq.numel() > 1:
            # inv_freq[1] = base ** (-2 / d)  =>  base = inv_freq[1] ** (-d / 2).
            values["rotary_base"] = torch.exp(-torch.log(rope.inv_freq[1].double()) * self.rotary_dim / 2)
        # One host transfer for everything (this is the only sync, at logging time).
        stacked = torch.stack([v.reshape(()).double() for v in values.values()]).tolist()
        out = dict(zip(values.keys(), stacked))
        if rope.attention_factor != 1.0:
            out["attention_factor"] = float(rope.attention_factor)
        return out

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
        """The PosAug alpha of optimizer step `step` (shared by all microbatches and ranks)."""
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

    def sample_layer_alphas(self, step: int, device: torch.device | str | None = None) -> torch.Tensor:
        """Independent per-layer alphas [num_layers] of step `step`, drawn on `device`."""
        device = _device(device)
        if self.in_warmup(step):
            return torch.ones(self.num_layers, device=device)
        generator = position_generator(self.seed, step, PER_STEP, device, STREAM_LAYER_ALPHA)
        u = torch.rand(self.num_layers, generator=generator, device=device)
        cfg = self.config
        if cfg.alpha_distribution == "discrete":
            n = len(cfg.alpha_values)
            return self._table("alpha_values", device)[(u * n).long().clamp_(max=n - 1)]
        return self._alpha_from_uniform(u, step)

    def sample_base(self, step: int) -> float:
        """The random_base RoPE base of step `step`: U[min_factor * B0, max_factor * B0]."""
        cfg = self.config
        u = torch.rand((), generator=position_generator(self.seed, step, PER_STEP, "cpu", STREAM_BASE),
                       dtype=torch.float64).item()
        return self.rotary_base * (cfg.base_min_factor + u * (cfg.base_max_factor - cfg.base_min_factor))

    # -------------------------------------------------------------------- helpers

    def _alpha_from_uniform(self, u, step: int):
        """Map u ~ U[0, 1) (float or tensor) to alpha under the configured distribution."""
        cfg = self.config
        if cfg.alpha_distribution == "discrete":
            n = len(cfg.alpha_values)
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

    def _posaug(self, step: int, seq_len: int, device: torch.device) -> RopePositions:
        mode = self.config.layer_mode
        base = strategies.scaled_positions(seq_len, 1.0, device)
        if mode == "independent":
            alphas = self.sample_layer_alphas(step, device)
            return RopePositions(base, layer_positions=alphas.unsqueeze(1) * base)
        alpha = self.sample_alpha(step)
        scaled = base * alpha
        if mode == "all":
            return RopePositions(scaled)
        # bottom/top: the listed layers get alpha * i, the others the plain positions.
        # The mask is built on device from arange, so no host->device copy is needed.
        layer = torch.arange(self.num_layers, device=device).unsqueeze(1)
        k = self.config.layer_count
        chosen = layer < k if mode == "bottom" else layer >= self.num_layers - k
        return RopePositions(base, layer_positions=torch.where(chosen, scaled, base))


def build_sampler(config: PositionConfig, **kwargs) -> PositionSampler:
    """Construct the `PositionSampler` for `config` (keyword arguments as PositionSampler)."""
    return PositionSampler(config, **kwargs)
