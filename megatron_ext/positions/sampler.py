"""`PositionSampler`: turns a `PositionConfig` into the `RopePositions` of a microbatch.

Randomness contract: every draw comes from `PositionDraws` (draws.py, where the contract is
spelled out): a pure function of the seed, the optimizer step and, for per-sample draws, the
sequence's index in the step's global batch, never of the parallel layout.
Per-example lengths (`training(..., lengths=)`, right-padded variable-length data): the
draws stay keyed and sized as above, at the window size seq_len, so they are still
layout-invariant; row b's real positions (j < lengths[b]) are a function of row b's own
draws and its own length only, never of the other rows' lengths.
Granularity (`positions.granularity`): per_step = one draw for the whole global batch
(positions [s]); per_sample = one draw per sequence (positions [b, s], or per-sample
inverse frequencies for random_base).

Cost contract: position tensors are built on the requested device with a handful of
tensor ops; per-step scalars (alpha, RoPE base) are drawn with a CPU generator, which
never waits on the accelerator. Nothing in `training` reads a device tensor back to the
host, unless `lengths` is given on one (they are range-checked on the host: pass them on the
CPU, as the data yields them; they then cost one small host->device copy, like the tokens).
per_sample adds one generator and one small RNG call per sequence of the microbatch
(O(micro_batch_size) kernel launches), and its [b, s] positions leave the fused RoPE path
(Transformer Engine's fused kernel takes one position row per batch).
"""
from __future__ import annotations

import dataclasses

import torch

from . import documents as per_document
from . import drope, randomized_yarn, strategies
from .config import PositionConfig
from .draws import PositionDraws, as_device
from .pose import pose_positions
from .rng import PER_STEP, STREAM_BASE, STREAM_EVAL, STREAM_POSITIONS, position_generator
from .rope_positions import RopePositions
from .scaling import RopeScaling, scaled_inv_freq


class PositionSampler(PositionDraws):
    """Builds RoPE positions for training microbatches and for evaluation."""

    def __init__(self, config: PositionConfig, *, seed: int, train_seq_len: int, num_layers: int,
                 rotary_dim: int, rotary_base: float, total_steps: int,
                 global_layers: list[bool] | None = None) -> None:
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
        if global_layers is not None and len(global_layers) != num_layers:
            raise ValueError(f"global_layers has {len(global_layers)} entries; the model has {num_layers} layers")
        # PosAug layer_mode=global scales these layers (ModelConfig.global_rope_layers: full attention with RoPE).
        self.global_layers = None if global_layers is None else [bool(g) for g in global_layers]
        super().__init__(config, seed=seed, num_layers=num_layers, rotary_dim=rotary_dim, rotary_base=rotary_base,
                         total_steps=total_steps)
        self.train_seq_len = int(train_seq_len)
        if config.layer_mode == "global" and global_layers is not None:
            self._global_mask(torch.device("cpu"))  # validates: at least one layer to scale
        # drope: the pretraining strategy's own sampler before the switch (its draws, bitwise), none after it.
        self._pretraining: PositionSampler | None = None
        self.switch_step: int | None = None
        if config.strategy == "drope":
            self._pretraining = PositionSampler(
                dataclasses.replace(config, strategy=config.drope_pretraining), seed=seed,
                train_seq_len=train_seq_len, num_layers=num_layers, rotary_dim=rotary_dim, rotary_base=rotary_base,
                total_steps=total_steps, global_layers=global_layers)
            self.switch_step = drope.switch_step(total_steps, config.drope_share)

    # ------------------------------------------------------------------ public API

    @property
    def needs_per_sample(self) -> bool:
        """True when training positions differ per sequence ([b, s]; the model must use unfused RoPE)."""
        if self._pretraining is not None:
            return self._pretraining.needs_per_sample
        return self.config.granularity == "per_sample" and self.config.strategy != "none"

    def phase(self, trained_steps: int | None) -> str | None:
        """DroPE's phase of a checkpoint after `trained_steps` steps (None: the finished run); None for others."""
        if self.switch_step is None:
            return None
        if trained_steps is None:
            return "recalibration"
        return drope.phase(trained_steps, self.total_steps, self.config.drope_share)

    def training(self, step: int, seq_len: int, *, first_sample: int, batch_size: int,
                 device: torch.device | str | None = None, lengths: torch.Tensor | None = None,
                 documents: per_document.Documents | None = None) -> RopePositions:
        """Positions of the `batch_size` sequences of step `step` whose global-batch indices start at `first_sample`.

        `lengths`: optional int tensor [batch_size], each sequence's real token count (1..seq_len;
        the rest is right padding). rfs / rpe / warp / ryarn at per_sample granularity then draw for each
        sequence's own length, as their papers do (RFS: n sorted uniforms in [0, L); RPE and ryarn: n
        sorted distinct integers of [0, L) (ryarn: [0, L_t)); warp: the tail l·f(j / l) with l = n). It is ignored
        otherwise: a per_step draw is one row shared by the batch, which cannot fit several
        lengths; posaug's α·i, random_base and none do not depend on the length.
        Padding positions (j >= n) are finite: L for rfs / rpe (L_t for ryarn), the row's own rule continued
        (tail: l) for warp. They are loss-masked and, under causal attention, attended to only
        by later padding tokens, so they never reach a real token.

        `documents` (data.document_masking): where each window's documents lie; positions then
        restart at every document and each strategy draws per document (megatron_ext.positions.documents);
        positions are [b, s] and `lengths` is ignored (the data makes padding a document of its own).
        """
        if step < 0:
            raise ValueError(f"step must be >= 0 (got {step})")
        if seq_len < 1:
            raise ValueError(f"seq_len must be >= 1 (got {seq_len})")
        if first_sample < 0:
            raise ValueError(f"first_sample must be >= 0 (got {first_sample}): it is the index of the "
                             "microbatch's first sequence in the step's global batch")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1 (got {batch_size})")
        if lengths is not None:
            _check_lengths(lengths, seq_len, batch_size)
        device = as_device(device)
        if self._pretraining is not None:
            if step < self.switch_step:
                return self._pretraining.training(step, seq_len, first_sample=first_sample, batch_size=batch_size,
                                                  device=device, lengths=lengths, documents=documents)
            return self._no_rope(seq_len, as_device(device), documents)
        samples = range(first_sample, first_sample + batch_size) if self.needs_per_sample else None
        cfg = self.config
        if documents is not None:
            return self._per_document(step, seq_len, samples, documents.to(device), device)
        if samples is None or cfg.strategy not in ("rfs", "rpe", "warp", "ryarn"):
            lengths = None
        elif lengths is not None:
            lengths = lengths.to(device=device, dtype=torch.long)
        if cfg.strategy == "none":
            return RopePositions(strategies.scaled_positions(seq_len, 1.0, device))
        if cfg.strategy == "posaug":
            return self._posaug(step, seq_len, samples, device)
        if cfg.strategy == "random_base":
            return RopePositions(strategies.scaled_positions(seq_len, 1.0, device),
                                 inv_freq=self._random_inv_freq(step, samples, device))
        if cfg.strategy == "rfs":
            uniforms = self._uniforms(step, samples, seq_len, STREAM_POSITIONS, device)
            return RopePositions(strategies.rfs_train_positions(uniforms, cfg.max_position, lengths))
        if cfg.strategy == "rpe":
            cfg.validate_for(seq_len)
            keys = self._uniforms(step, samples, cfg.max_position, STREAM_POSITIONS, device)
            return RopePositions(strategies.rpe_positions(keys, seq_len, lengths))
        if cfg.strategy == "warp":
            head_alphas = None if cfg.head_alpha_fixed is not None else self._table("head_alphas", device)
            uniforms = self._uniforms(step, samples, 2, STREAM_POSITIONS, device)
            return RopePositions(strategies.warp_positions(
                uniforms, seq_len, p_head=cfg.p_head, p_tail=cfg.p_tail, head_alphas=head_alphas,
                head_alpha_fixed=cfg.head_alpha_fixed, tail_function=cfg.tail_function, lengths=lengths))
        if cfg.strategy == "pose":
            cfg.validate_for(seq_len)
            cut_keys = self._uniforms(step, samples, seq_len - 1, STREAM_POSITIONS, device)
            biases = self._uniforms(step, samples, cfg.pose_chunks, STREAM_BASE, device)
            return RopePositions(pose_positions(cut_keys, biases, seq_len, cfg.max_position))
        if cfg.strategy == "ryarn":
            keys = self._uniforms(step, samples, self._ryarn_range(step, seq_len), STREAM_POSITIONS, device)
            return self._ryarn(strategies.rpe_positions(keys, seq_len, lengths), device)
        raise AssertionError(f"unhandled strategy {cfg.strategy!r}")  # guarded by PositionConfig

    def evaluation(self, seq_len: int, device: torch.device | str | None = None, *,
                   trained_steps: int | None = None) -> RopePositions:
        """Deterministic positions for evaluating at `seq_len`, plus positions.rope_scaling on top.

        `trained_steps`: the optimizer steps the evaluated weights trained for; only DroPE reads it (a checkpoint
        still in pretraining is the pretraining strategy's RoPE model; None = the finished run, without RoPE)."""
        if seq_len < 1:
            raise ValueError(f"seq_len must be >= 1 (got {seq_len})")
        device = as_device(device)
        cfg = self.config
        if self._pretraining is not None:
            if self.phase(trained_steps) == "pretraining":
                return self._pretraining.evaluation(seq_len, device)
            return self._no_rope(seq_len, device, None)
        if cfg.strategy == "ryarn":
            # No sampling at inference (the paper): plain positions under YaRN at s, or at s' >= s.
            factor = randomized_yarn.inference_factor(cfg.ryarn_scale(self.train_seq_len), cfg.rope_scaling,
                                                      cfg.rope_scaling_factor)
            inv_freq, attention_factor = randomized_yarn.yarn_frequencies(
                self.rotary_dim, self.rotary_base, factor, self.train_seq_len, device)
            return RopePositions(strategies.scaled_positions(seq_len, 1.0, device), inv_freq=inv_freq,
                                 attention_factor=attention_factor)
        if cfg.strategy == "rfs":
            positions = strategies.rfs_eval_positions(seq_len, self.train_seq_len, cfg.max_position, device)
        elif cfg.strategy == "rpe":
            # Ruoss et al. evaluate with the same random procedure; a fixed eval
            # stream makes every evaluation of a run use the same positions.
            cfg.validate_for(seq_len)
            generator = position_generator(self.seed, PER_STEP, PER_STEP, device, STREAM_EVAL)
            keys = torch.rand(cfg.max_position, generator=generator, device=device)
            positions = strategies.rpe_positions(keys, seq_len)
        elif cfg.strategy == "warp":
            # The warping paper evaluates with PI at ratio train_len / eval_len
            # (never stretching positions when evaluating at or below train_len).
            positions = strategies.scaled_positions(seq_len, min(1.0, self.train_seq_len / seq_len), device)
        else:
            # none, posaug (alpha = 1), random_base (the model's own base) and pose (plain ids, as its paper).
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
                if self.config.layer_mode in ("bottom", "top"):
                    # The scaled rows: first layer_count (bottom) or last (top).
                    row_alpha = row_alpha[0] if self.config.layer_mode == "bottom" else row_alpha[-1]
                elif self.config.layer_mode == "global":
                    row_alpha = row_alpha[self.global_layers.index(True)]
                if row_alpha.numel() == 1:
                    values["alpha"] = row_alpha
                else:  # per layer (independent) and/or per sample
                    values["alpha"] = row_alpha.mean()
                    values["alpha_min"] = row_alpha.min()
                    values["alpha_max"] = row_alpha.max()
        if self.config.strategy == "random_base" and rope.inv_freq is not None and rope.inv_freq.shape[-1] > 1:
            # inv_freq[1] = base ** (-2 / d)  =>  base = inv_freq[1] ** (-d / 2); mean over samples. Only random_base
            # draws a base: YaRN's frequencies (ryarn) are no single base's.
            bases = torch.exp(-torch.log(rope.inv_freq[..., 1].double()) * self.rotary_dim / 2)
            values["rotary_base"] = bases.mean()
        # One host transfer for everything (this is the only sync, at logging time).
        stacked = torch.stack([v.reshape(()).double() for v in values.values()]).tolist()
        out = dict(zip(values.keys(), stacked))
        if rope.attention_factor != 1.0:
            out["attention_factor"] = float(rope.attention_factor)
        return out

    def _per_document(self, step: int, seq_len: int, samples: range | None, documents: per_document.Documents,
                      device: torch.device) -> RopePositions:
        """Positions restarting at every document, each strategy's draws made per document: [b, s]."""
        if tuple(documents.index.shape[-1:]) != (seq_len,):
            raise ValueError(f"documents cover {documents.index.shape[-1]} tokens; the window has {seq_len}")
        cfg = self.config
        offsets = documents.offsets.to(torch.float32)
        if cfg.strategy == "none":
            return RopePositions(offsets)
        if cfg.strategy == "posaug":
            return self._posaug(step, seq_len, samples, device, base=offsets)
        if cfg.strategy == "random_base":
            return RopePositions(offsets, inv_freq=self._random_inv_freq(step, samples, device))
        if cfg.strategy == "rfs":
            uniforms = self._uniforms(step, samples, seq_len, STREAM_POSITIONS, device)
            return RopePositions(per_document.rfs_document_positions(uniforms, documents, cfg.max_position))
        if cfg.strategy == "rpe":
            keys = self._uniforms(step, samples, cfg.max_position, STREAM_POSITIONS, device)
            return RopePositions(per_document.rpe_document_positions(keys, documents))
        if cfg.strategy == "warp":
            head_alphas = None if cfg.head_alpha_fixed is not None else self._table("head_alphas", device)
            return RopePositions(per_document.warp_document_positions(
                self._document_draws(step, samples, seq_len, device), documents, p_head=cfg.p_head,
                p_tail=cfg.p_tail, head_alphas=head_alphas, head_alpha_fixed=cfg.head_alpha_fixed,
                tail_function=cfg.tail_function))
        if cfg.strategy == "ryarn":
            keys = self._uniforms(step, samples, self._ryarn_range(step, seq_len), STREAM_POSITIONS, device)
            return self._ryarn(per_document.rpe_document_positions(keys, documents), device)
        raise AssertionError(f"unhandled strategy {cfg.strategy!r}")  # guarded by PositionConfig

    @staticmethod
    def _no_rope(seq_len: int, device: torch.device, documents: per_document.Documents | None) -> RopePositions:
        """DroPE after its switch: every position 0, so every layer's angles are 0 (cos 1, sin 0: no rotation)."""
        if documents is not None:
            return RopePositions(torch.zeros(documents.index.shape, dtype=torch.float32, device=device))
        return RopePositions(torch.zeros(seq_len, dtype=torch.float32, device=device))

    def _ryarn_range(self, step: int, seq_len: int) -> int:
        """L_t of step `step` under the length curriculum (at least seq_len: a subset of seq_len must fit)."""
        cfg = self.config
        return max(seq_len, randomized_yarn.position_range(step, self.total_steps, self.train_seq_len,
                                                           cfg.max_position, cfg.ryarn_stages))

    def _ryarn(self, positions: torch.Tensor, device: torch.device) -> RopePositions:
        """Sampled positions under YaRN at the run's s; the frequencies are a constant, built once per device."""
        key = ("ryarn_inv_freq", device)
        if key not in self._device_tables:
            inv_freq, self._ryarn_attention = randomized_yarn.yarn_frequencies(
                self.rotary_dim, self.rotary_base, self.config.ryarn_scale(self.train_seq_len), self.train_seq_len,
                device)
            self._device_tables[key] = inv_freq
        return RopePositions(positions, inv_freq=self._device_tables[key], attention_factor=self._ryarn_attention)

    def _posaug(self, step: int, seq_len: int, samples: range | None, device: torch.device,
                base: torch.Tensor | None = None) -> RopePositions:
        """α·i over `base` positions (arange, or [b, s] offsets within documents)."""
        mode = self.config.layer_mode
        if base is None:
            base = strategies.scaled_positions(seq_len, 1.0, device)
        if mode == "independent":
            alphas = self.sample_layer_alphas(step, device, samples)  # [L] or [L, b]
            # [L] -> [L, 1, ..., 1]; [L, b] -> [L, b, 1]: broadcast against base [s] or [b, s]
            alphas = alphas.view(-1, *[1] * base.dim()) if alphas.dim() == 1 else alphas.unsqueeze(-1)
            return RopePositions(base, layer_positions=alphas * base)
        if samples is None:
            scaled = base * self.sample_alpha(step)  # [s]
        else:
            scaled = self.sample_alphas(step, samples, device).unsqueeze(1) * base  # [b, s]
        if mode == "all":
            return RopePositions(scaled)
        # bottom/top/global: the listed layers get alpha * i, the others the plain positions.
        # The mask is built on device from arange, so no host->device copy is needed.
        layer = torch.arange(self.num_layers, device=device).view(-1, *[1] * scaled.dim())
        k = self.config.layer_count
        if mode == "global":
            chosen = self._global_mask(device).view_as(layer)
        else:
            chosen = layer < k if mode == "bottom" else layer >= self.num_layers - k
        return RopePositions(base, layer_positions=torch.where(chosen, scaled, base))

    def _global_mask(self, device: torch.device) -> torch.Tensor:
        """[num_layers] bool: the layers layer_mode=global scales (cached per device: no copy every step)."""
        if self.global_layers is None or not any(self.global_layers):
            raise ValueError("positions.layer_mode=global scales the full-attention RoPE layers of a model with "
                             "sliding-window layers: set model.window_size and model.window_attn_skip_freq with a "
                             "global RoPE layer (model.no_rope_freq makes them NoPE), or use layer_mode=all")
        key = ("global_layers", device)
        if key not in self._device_tables:
            self._device_tables[key] = torch.tensor(self.global_layers, device=device)
        return self._device_tables[key]


def _check_lengths(lengths: torch.Tensor, seq_len: int, batch_size: int) -> None:
    """ValueError naming `lengths` unless it is an integer tensor [batch_size] within 1..seq_len."""
    if not isinstance(lengths, torch.Tensor) or lengths.dtype.is_floating_point or lengths.dtype.is_complex \
            or lengths.dtype == torch.bool:
        raise ValueError(f"lengths must be an integer tensor of each sequence's token count (got {lengths!r})")
    if tuple(lengths.shape) != (batch_size,):
        raise ValueError(f"lengths must have shape [batch_size] = [{batch_size}] (got {list(lengths.shape)})")
    host = lengths.detach().cpu()  # a no-op for CPU lengths, as the data yields them
    low, high = int(host.min()), int(host.max())
    if low < 1 or high > seq_len:
        raise ValueError(f"lengths must lie in 1..seq_len={seq_len}, each sequence's real token count "
                         f"(got min {low}, max {high})")


def build_sampler(config: PositionConfig, **kwargs) -> PositionSampler:
    """Construct the `PositionSampler` for `config` (keyword arguments as PositionSampler)."""
    return PositionSampler(config, **kwargs)
