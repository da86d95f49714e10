"""Rank-independent randomness for position strategies.

Every random draw made by a position strategy comes from `position_generator`.
The generator is seeded from a hash of (seed, iteration, microbatch, stream), so
every tensor-, pipeline-, data- and context-parallel rank computes the same
positions for the same microbatch without any communication.

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

# Streams separate independent purposes that share (seed, iteration, microbatch),
# so e.g. the per-layer alphas are not a prefix of the per-step alpha stream.
STREAM_ALPHA = 0          # per-step scalar alpha (PosAug)
STREAM_LAYER_ALPHA = 1    # per-step per-layer alphas (PosAug layer_mode=independent)
STREAM_BASE = 2           # per-step RoPE base (random_base)
STREAM_POSITIONS = 3      # per-microbatch position tensors (rfs, rpe, warp)
STREAM_EVAL = 4           # fixed evaluation draws (rpe evaluation positions)

PER_STEP = -1  # microbatch index used for draws shared by all microbatches of a step

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def position_seed(seed: int, iteration: int, microbatch: int, stream: int = 0) -> int:
    """63-bit seed derived from blake2b of (seed, iteration, microbatch, stream)."""
    for name, value in (("seed", seed), ("iteration", iteration),
                        ("microbatch", microbatch), ("stream", stream)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"position_generator: {name} must be an int (got {value!r})")
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise ValueError(f"position_generator: {name} must fit in int64 (got {value})")
    payload = struct.pack("<4q", seed, iteration, microbatch, stream)
    # A cryptographic hash (rather than seed + iteration) keeps neighbouring
    # steps/microbatches statistically unrelated.
    digest = hashlib.blake2b(payload, digest_size=8, person=b"megatron-posaug").digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def position_generator(
    seed: int,
    iteration: int,
    microbatch: int,
    device: torch.device | str = "cpu",
    stream: int = 0,
) -> torch.Generator:
    """Fresh generator on `device` seeded from a hash of (seed, iteration, microbatch, stream)."""
    generator = torch.Generator(device=torch.device(device))
    generator.manual_seed(position_seed(seed, iteration, microbatch, stream))
    return generator
