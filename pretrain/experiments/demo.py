"""`python -m pretrain demo`: the README's main job — baseline vs PosAug on CPU, no download.

Builds a corpus from the Python standard library's own text, trains a SentencePiece
tokenizer on it, tokenises it into Megatron shards, trains a ~1.4M-parameter baseline and a
PosAug U[1/8, 8] model (w = 64) through Megatron-Core, evaluates both at 8w on 400
validation spans, and prints in-distribution loss, loss beyond the window and the cliff,
with the paired per-span cliff difference. About 10 minutes on 2 cores; rerunning reuses
finished steps.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from pretrain.cli import Parser
from pretrain.experiments.presets import PRESETS


def main(argv: list[str]) -> int:
    """CLI for `python -m pretrain demo`."""
    parser = Parser(prog="python -m pretrain demo", description=__doc__.split("\n")[0])
    parser.add_argument("--output", default="demo_out", help="working directory (resumable)")
    parser.add_argument("--preset", default="cpu-small", choices=sorted(PRESETS), help="scale of the two runs")
    args = parser.parse_args(argv)
    from pretrain.experiments import reproduce

    preset = dataclasses.replace(reproduce.PRESETS[args.preset], methods=("baseline", "posaug"), inference=(),
                                 gain_spans=0)
    try:
        report = reproduce.reproduce(Path(args.output), preset, seeds=[42], preset_name=f"demo-{args.preset}")
    except (ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"per-position loss plot: {report.parent / 'per_position_loss.png'}")
    return 0
