"""The numerics canary: a fixed tiny training whose per-step losses are pinned, so that a change that moves
training numerics is seen here, with the list of stored numbers that quote training results and must be measured
again (the README's demo table first). Pinned on the megatron-core and torch of constraints-cpu.txt, which produce
the stored results; on another version the canary is skipped with the reason."""

import importlib.metadata
import re

import pytest

from conftest import REPO, TINY_TRAIN, run_train

# python -m pretrain train --set <TINY_TRAIN> data.synthetic=true schedule.train_iters=4, on constraints-cpu.txt
PINNED_LOSSES = {1: 6.2401, 2: 6.2585, 3: 6.2667, 4: 6.2436}
# What quotes training results, in the order to measure again (each file names its command).
QUOTED = ("benchmarks/results/demo_cpu-small_seed42.md (the README's demo table: `make demo`, then "
          "`python benchmarks/readme_demo_table.py --write`)",
          "README.md's figure caption (benchmarks/results/reproduce_cpu-long_seed42.md)",
          "benchmarks/README.md's index rows and the benchmarks/results/ files they name")


def _pinned_versions() -> dict[str, str]:
    lines = (REPO / "constraints-cpu.txt").read_text().splitlines()
    return dict(line.split("==") for line in lines if "==" in line and not line.startswith("#"))


@pytest.mark.skipif(any(importlib.metadata.version(name).split("+")[0] != version
                        for name, version in _pinned_versions().items()),
                    reason="the losses are pinned on constraints-cpu.txt's torch and megatron-core")
def test_a_fixed_tiny_training_gives_the_pinned_losses(tmp_path):
    proc = run_train([*TINY_TRAIN, "data.synthetic=true", "schedule.train_iters=4", f"checkpoint.save={tmp_path}"])
    losses = {int(step): float(loss) for step, loss in re.findall(r"^step (\d+)/4 \| loss ([\d.]+)", proc.stdout,
                                                                   re.M)}
    assert losses == PINNED_LOSSES, (
        f"training numerics moved: losses {losses}, pinned {PINNED_LOSSES}. If the change is meant, pin the new "
        "losses here and measure again what quotes training results: " + "; ".join(QUOTED))
