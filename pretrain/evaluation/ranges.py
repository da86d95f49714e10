"""The cliff's in-distribution range: one definition for `reproduce`, `eval run`, `eval all`, the ablation and grid
reports (torch-free, so presets and `--help` read it without importing torch).

In-distribution targets are in_start..w with in_start = min(64, w/4):
- at w >= 256 it is the paper's 64 (positions 64–w at w = 2048), so a GPU run measures what the paper measures;
- below, a quarter of the window: 64 would leave half of a w = 128 window and nothing of a w = 64 one.
The first targets are left out because a target with few tokens before it has a high loss for lack of context,
whatever the position method; the last three quarters of the window are where a model has the context it was
trained with, which is what "beyond w" is compared against.
"""

from __future__ import annotations

PAPER_IN_START = 64


def cliff_in_start(window: int) -> int:
    """First in-distribution target of the cliff for a training window w: min(64, w // 4), at least 1."""
    return max(1, min(PAPER_IN_START, window // 4))
