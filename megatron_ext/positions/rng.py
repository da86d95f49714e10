"""Rank-independent randomness for position strategies.

Every random draw made by a position strategy comes from `position_generator`.
The generator is seeded from a hash of (seed, iteration, sample, stream), where
`sample` is a sequence's index in the step's global batch (or PER_STEP for draws
shared by the whole global batch). None of these depends on the parallel layout
(TP/PP/DP/CP sizes, micro-batch size, gradient-accumulation count), so every rank
computes the same positions for the same sequence without any communication, and
a run draws the same positions on 1 GPU or 64.

Why not the default RNG: Megatron seeds the default torch RNG differently per
pipeline rank (and the CUDA RNG tracker per tensor-parallel rank), so drawing
positions from it would give different layers/shards different positions.

Device note: CPU and CUDA generators implement different algorithms (mt19937 vs
Philox), so the same seed gives different streams on different device types.
All ranks of one job use the same device type, so they still agree; results are
reproducible per device type, not across device types.
"""

from __future__ import annotations

import hashlib
import struct

import torch

# Streams separate independent purposes that share (seed, iteration, sample),
# so e.g. the per-layer alphas are not a prefix of the per-step alpha stream.
STREAM_ALPHA = 0          # per-step scalar alpha (PosAug)
STREAM_LAYER_ALPHA = 1    # per-step per-layer alphas (PosAug layer_mode=independent)
STREAM_BASE = 2           # per-step RoPE base (random_base)
STREAM_POSITIONS = 3      # position tensors (rfs, rpe, warp)
STREAM_EVAL = 4           # fixed evaluation draws (rpe evaluation positions)

PER_STEP = -1  # sample index of draws shared by the whole global batch of a step

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def position_seed(seed: int, iteration: int, sample: int, stream: int = 0) -> int:
    """63-bit seed derived from blake2b of (seed, iteration, sample, stream)."""
    for name, value in (("seed", seed), ("iteration", iteration),
                        ("sample", sample), ("stream", stream)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"position_generator: {name} must be an int (got {value!r})")
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise ValueError(f"position_generator: {name} must fit in int64 (got {value})")
    payload = struct.pack("<4q", seed, iteration, sample, stream)
    # A cryptographic hash (rather than seed + iteration) keeps neighbouring
    # steps/samples statistically unrelated.
    digest = hashlib.blake2b(payload, digest_size=8, person=b"megatron-posaug").digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def position_generator(
    seed: int,
    iteration: int,
    sample: int,
    device: torch.device | str = "cpu",
    stream: int = 0,
) -> torch.Generator:
    """Fresh generator on `device` seeded from a hash of (seed, iteration, sample, stream)."""
    generator = torch.Generator(device=torch.device(device))
    generator.manual_seed(position_seed(seed, iteration, sample, stream))
    return generator
