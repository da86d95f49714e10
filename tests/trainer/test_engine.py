"""Training-step safety: a non-finite loss stops the run and names the step and microbatch."""

import pytest
import torch

from pretrain.trainer.engine import NonFiniteLossError, _reduce_loss


def test_non_finite_loss_names_step_and_microbatch(megatron_world):
    records = [{"lm loss": torch.tensor(2.0), "microbatch": 0}, {"lm loss": torch.tensor(float("nan")), "microbatch": 1}]
    with pytest.raises(NonFiniteLossError, match="step 17, microbatch 1"):
        _reduce_loss(records, step=17)


def test_finite_losses_average_over_microbatches(megatron_world):
    records = [{"lm loss": torch.tensor(2.0), "microbatch": 0}, {"lm loss": torch.tensor(4.0), "microbatch": 1}]
    assert _reduce_loss(records, step=0) == pytest.approx(3.0)
