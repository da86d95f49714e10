"""Training-step safety: the reduced loss says which microbatch went non-finite, so the step can be skipped."""

import math

import pytest
import torch

from pretrain.trainer.engine import _reduce_loss


def test_non_finite_loss_names_its_first_microbatch(megatron_world):
    records = [{"lm loss": torch.tensor(2.0), "microbatch": 0}, {"lm loss": torch.tensor(float("nan")), "microbatch": 1},
               {"lm loss": torch.tensor(float("inf")), "microbatch": 2}]
    loss, bad_microbatch = _reduce_loss(records)
    assert bad_microbatch == 1 and not math.isfinite(loss)


def test_finite_losses_average_over_microbatches(megatron_world):
    records = [{"lm loss": torch.tensor(2.0), "microbatch": 0}, {"lm loss": torch.tensor(4.0), "microbatch": 1}]
    assert _reduce_loss(records) == (pytest.approx(3.0), None)
