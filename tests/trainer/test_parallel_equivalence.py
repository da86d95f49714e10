"""TP=2, PP=2 (1F1B) and DP=2 under torchrun/gloo give one process's loss and gradient norm."""

import pytest

from conftest import run_torchrun

pytestmark = [pytest.mark.slow]  # torchrun TP/PP/DP layouts

SCRIPT = "tests/distributed/parallel_step.py"
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def single_process():
    return run_torchrun(SCRIPT, 1, "--steps", "2")


@pytest.mark.parametrize("layout", [["--tp", "2"], ["--pp", "2"], [], ["--distributed-optimizer"]],
                         ids=["tp2", "pp2", "dp2", "dp2-distributed-optimizer"])
def test_two_process_layout_matches_one_process(single_process, layout):
    parallel = run_torchrun(SCRIPT, 2, "--steps", "2", *layout)
    assert len(parallel) == len(single_process) == 2
    for got, expected in zip(parallel, single_process):
        assert abs(got["loss"] - expected["loss"]) <= TOLERANCE * max(1.0, abs(expected["loss"]))
        assert abs(got["grad_norm"] - expected["grad_norm"]) <= TOLERANCE * max(1.0, expected["grad_norm"])
