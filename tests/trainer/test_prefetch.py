"""data.prefetch: the background loader hands out exactly step_batches' samples, in order, from any resume step."""

import pytest
import torch

from pretrain.trainer.data import DataError, Prefetcher, step_batches


class IndexedSamples:
    """Sample i holds the token i everywhere: a batch says which samples it holds."""

    def __init__(self, size: int, fail_at: int | None = None) -> None:
        self.size, self.fail_at = size, fail_at

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict:
        if index == self.fail_at:
            raise DataError(f"sample {index}: unreadable shard")
        tokens = torch.full((4,), index)
        return {"tokens": tokens, "labels": tokens, "loss_mask": torch.ones(4)}


def sample_ids(microbatches) -> list[list[int]]:
    return [batch["tokens"][:, 0].tolist() for batch in microbatches]


@pytest.mark.parametrize("dp_rank, dp_size", [(0, 1), (1, 2)])
def test_prefetched_steps_hold_the_samples_step_batches_gives(dp_rank, dp_size):
    source = IndexedSamples(100)
    prefetch = Prefetcher(source, 0, 6, 8, dp_rank, dp_size, 2)
    try:
        for step in range(6):
            assert sample_ids(prefetch.step(step)) == sample_ids(step_batches(source, step, 8, dp_rank, dp_size, 2))
    finally:
        prefetch.close()


def test_a_resumed_prefetcher_continues_with_the_samples_of_its_start_step():
    source = IndexedSamples(100)
    whole, resumed = Prefetcher(source, 0, 5, 4, 0, 1, 2), Prefetcher(source, 3, 5, 4, 0, 1, 2)
    try:
        from_start = [sample_ids(whole.step(step)) for step in range(5)]
        assert [sample_ids(resumed.step(step)) for step in (3, 4)] == from_start[3:]
        assert from_start[3] == [[12, 13], [14, 15]]  # consumed_samples = step × global batch, as before
    finally:
        whole.close()
        resumed.close()


def test_a_read_error_in_the_loader_is_raised_at_its_step():
    prefetch = Prefetcher(IndexedSamples(100, fail_at=9), 0, 4, 4, 0, 1, 2)
    try:
        assert sample_ids(prefetch.step(0)) == [[0, 1], [2, 3]]
        assert sample_ids(prefetch.step(1)) == [[4, 5], [6, 7]]
        with pytest.raises(DataError, match="sample 9: unreadable shard"):
            prefetch.step(2)
    finally:
        prefetch.close()


def test_steps_asked_out_of_order_are_refused():
    prefetch = Prefetcher(IndexedSamples(100), 0, 4, 4, 0, 1, 2)
    try:
        with pytest.raises(RuntimeError, match="step 1 asked for, step 0 prepared"):
            prefetch.step(1)
    finally:
        prefetch.close()


def test_closing_stops_the_loader_thread_while_it_waits():
    prefetch = Prefetcher(IndexedSamples(10_000), 0, 1000, 4, 0, 1, 2)
    prefetch.close()
    assert not prefetch._thread.is_alive()
