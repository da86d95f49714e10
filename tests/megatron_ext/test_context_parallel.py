"""Context parallel pieces on CPU (CP attention itself needs Transformer Engine): Megatron's zigzag slices,
each rank's angles, and the loss reduction over a real two-rank CP group (torchrun/gloo, ~20 s)."""

import pytest
import torch

from conftest import run_torchrun
from megatron_ext import context_parallel

SCRIPT = "tests/distributed/cp_pieces.py"
S = 16  # cp_pieces.S; CP = 2, so 4 chunks of 4 tokens


@pytest.fixture(scope="module")
def records():
    return run_torchrun(SCRIPT, 2, timeout=300)


def of_kind(records, kind):
    return [r["ranks"] for r in records if r["kind"] == kind]


@pytest.mark.slow  # one two-rank torchrun shared by the module
def test_cp_ranks_hold_megatrons_zigzag_chunks_that_concatenate_back_to_the_sequence(records):
    (ranks,) = of_kind(records, "slices")
    # Megatron's order: rank r holds chunks r and 2 * CP - 1 - r of the 2 * CP chunks.
    assert ranks[0]["tokens"][0] == [0, 1, 2, 3, 12, 13, 14, 15]
    assert ranks[1]["tokens"][0] == [4, 5, 6, 7, 8, 9, 10, 11]
    chunks = {}
    for rank, record in enumerate(ranks):
        tokens = torch.tensor(record["tokens"])
        chunks[rank], chunks[3 - rank] = tokens[:, :4], tokens[:, 4:]
    assert torch.equal(torch.cat([chunks[i] for i in range(4)], dim=1), torch.arange(S).expand(3, S))


@pytest.mark.slow  # one two-rank torchrun shared by the module
def test_labels_and_loss_mask_are_sliced_like_the_tokens(records):
    (ranks,) = of_kind(records, "slices")
    for record in ranks:
        tokens = torch.tensor(record["tokens"])
        assert torch.equal(torch.tensor(record["labels"]), tokens + 100)
        assert torch.equal(torch.tensor(record["loss_mask"]), tokens.float())


@pytest.mark.slow  # one two-rank torchrun shared by the module
def test_each_cp_rank_gets_the_angles_of_its_own_tokens_full_length_positions(records):
    angle_records = of_kind(records, "angles")
    assert {ranks[0]["strategy"] for ranks in angle_records} == {
        "rfs_per_sample", "posaug_top_per_sample", "random_base_per_sample", "warp_per_step"}
    for ranks in angle_records:
        for record in ranks:
            assert record["shape"][-1] == S // 2
            assert record["max_diff"] == 0.0, record


@pytest.mark.slow  # one two-rank torchrun shared by the module
def test_cp_loss_reduction_equals_the_full_sequence_masked_mean(records):
    (ranks,) = of_kind(records, "loss")
    for record in ranks:
        assert record["reported"] == pytest.approx(record["full"], rel=1e-6)
        assert record["engine"] == pytest.approx(record["full"], rel=1e-6)
        # The backpropagated pieces add up to the full loss; each rank's gradient is the full one's slice.
        assert record["summed"] == pytest.approx(record["full"], rel=1e-6)
        assert record["grad_diff"] < 1e-9
    # The inputs are uneven on purpose: averaging per-rank means would be wrong.
    assert (ranks[0]["local_mean"] + ranks[1]["local_mean"]) / 2 != pytest.approx(ranks[0]["full"], rel=1e-3)


def test_sequence_length_not_divisible_by_twice_cp_is_rejected_with_the_fix():
    with pytest.raises(ValueError, match=r"model.seq_length \(30\) must be divisible by 2 × "
                                         r"parallel.context_parallel_size \(8\)"):
        context_parallel.check_divisible(30, 4)
