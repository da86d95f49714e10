"""Training and validation batches: Megatron GPTDatasets over data_prep shards, or synthetic tokens.

Sample order is a pure function of (seed, sample index): the batch of step i on DP rank r is
samples i·G + r·G/DP … (+G/DP), so resuming at step i needs only i — no loader state.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Protocol

import torch

from pretrain.trainer.config_values import shown
from pretrain.trainer.data_checks import DataError  # noqa: F401 (re-exported)
from pretrain.trainer.data_paths import check_build, check_data_path, parse_blend  # noqa: F401 (re-exported)
from pretrain.trainer.task_data import TaskDataSource, register_task_source, task_source  # noqa: F401 (re-exported)


class SampleSource(Protocol):
    """Anything indexable into GPTDataset-style samples."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> dict: ...


@dataclass
class _TokenizerInfo:
    """What GPTDataset needs of a tokenizer (the manifest has it; no tokenizer library needed)."""

    vocab_size: int
    eod: int
    pad: int
    unique_identifiers: dict


class SyntheticTokens:
    """Uniform random tokens, a fixed function of (seed, index): for smoke runs and tests.

    With `eod` (document masking or EOD loss masking on), documents: each token is EOD with
    probability 4 / seq_length (about four documents per window, some longer than it, some
    empty) and the other tokens never are."""

    def __init__(self, vocab_size: int, seq_length: int, seed: int, size: int, eod: int | None = None) -> None:
        self.vocab_size, self.seq_length, self.seed, self.size = vocab_size, seq_length, seed, size
        self.eod = eod

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        tokens = torch.randint(0, self.vocab_size, (self.seq_length + 1,), generator=generator)
        if self.eod is not None:
            tokens = torch.where(tokens == self.eod, (self.eod + 1) % self.vocab_size, tokens)
            ends = torch.rand(self.seq_length + 1, generator=generator) < 4 / self.seq_length
            tokens = torch.where(ends, self.eod, tokens)
        return {"tokens": tokens[:-1], "labels": tokens[1:], "loss_mask": torch.ones(self.seq_length)}


def build_datasets(data_path: str | list, seq_length: int, seed: int, num_train: int, num_valid: int,
                   cache_dir: Path) -> tuple[SampleSource, SampleSource | None]:
    """Megatron GPTDatasets (blended by weight for several data_prep outputs): train shards and validation."""
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    from pretrain.trainer.data_checks import check_indexes, checked

    check_data_path(data_path)
    parts = parse_blend(data_path)
    manifests = [check_build(prefix, seq_length) for _, prefix in parts]
    check_indexes(manifests)  # before Megatron reads them: a damaged index is an AssertionError there
    has_valid = num_valid > 0 and all(m.num_valid_tokens > seq_length + 1 for m in manifests)
    manifest = manifests[0]
    tokenizer = _TokenizerInfo(vocab_size=manifest.vocab_size, eod=manifest.eod_id, pad=manifest.eod_id,
                               unique_identifiers={"tokenizer": manifest.tokenizer_path})
    if len(parts) == 1:
        train_blend, valid_blend = (manifest.train_prefixes, None), ([manifest.valid_prefix], None)
    else:
        # A prefix's weight is shared by its shards in proportion to their tokens.
        shards = [(prefix, weight * shard["tokens"] / m.num_tokens)
                  for (weight, _), m in zip(parts, manifests)
                  for prefix, shard in zip(m.train_prefixes, m.raw["shards"])]
        train_blend = ([prefix for prefix, _ in shards], [weight for _, weight in shards])
        valid_blend = ([m.valid_prefix for m in manifests], [weight for weight, _ in parts])
    config = GPTDatasetConfig(
        random_seed=seed, sequence_length=seq_length,
        blend_per_split=[train_blend, valid_blend if has_valid else None, None],
        path_to_cache=str(cache_dir), tokenizer=tokenizer, reset_position_ids=False,
        reset_attention_mask=False, eod_mask_loss=False, create_attention_mask=False,
        # one shuffled copy of the shards per epoch; validation stays in stream order
        mid_level_dataset_surplus=0.005)
    train, valid, _ = BlendedMegatronDatasetBuilder(
        GPTDataset, [num_train, num_valid if has_valid else 0, 0], lambda: True, config).build()
    return checked(train, valid, manifests)


class DocumentSamples:
    """A source's samples with their documents (data.document_masking) and EOD loss masking (data.eod_mask_loss).

    Megatron's GPTDataset conventions (reset_position_ids, reset_attention_mask, eod_mask_loss):
    an EOD input ends its document, the next starts after it, and eod_mask_loss zeroes the loss
    of every EOD input (its target is the next document's first token). `document_index` [s] is
    each token's document ordinal in the window; the engine turns it into per-document positions
    and one block-diagonal causal mask per microbatch. A right-padded task example's padding is a
    document of its own (megatron_ext.positions.documents.document_index)."""

    def __init__(self, source: SampleSource, eod: int, document_masking: bool, eod_mask_loss: bool) -> None:
        self.source, self.eod = source, eod
        self.document_masking, self.eod_mask_loss = document_masking, eod_mask_loss

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> dict:
        from megatron_ext.positions.documents import document_index

        sample = dict(self.source[index])
        tokens = torch.as_tensor(sample["tokens"])
        if self.eod_mask_loss:
            sample["loss_mask"] = torch.as_tensor(sample["loss_mask"]).masked_fill(tokens == self.eod, 0.0)
        if self.document_masking:
            length = sample.get("position_length")
            sample["document_index"] = document_index(
                tokens[None], self.eod, None if length is None else torch.as_tensor(length).view(1))[0]
        return sample


def document_eod(data, vocab_size: int) -> int:
    """The EOD id that ends documents in data (config.data): the data_prep tokenizer's, the task's <eos>,
    or vocab_size - 1 for synthetic tokens."""
    if data.task:
        return task_source().eod
    if data.synthetic:
        return vocab_size - 1
    from data_prep.manifest import load_manifest

    # check_data_path makes every prefix of a blend share one tokenizer, hence one EOD.
    return load_manifest(parse_blend(data.data_path)[0][1]).eod_id


# position_length: the real (unpadded) input count of a right-padded sample; only variable-length
# sources (pretrain.tasks) have it, and the engine hands it to the position sampler.
# document_index: each token's document ordinal (data.document_masking; DocumentSamples).
BATCH_KEYS = ("tokens", "labels", "loss_mask")
OPTIONAL_BATCH_KEYS = ("position_length", "document_index")


def batches(source: SampleSource, first_sample: int, micro_batch_size: int,
            num_microbatches: int) -> Iterator[dict]:
    """`num_microbatches` stacked microbatches starting at sample `first_sample` (wraps around)."""
    for microbatch in range(num_microbatches):
        start = first_sample + microbatch * micro_batch_size
        samples = [source[(start + i) % len(source)] for i in range(micro_batch_size)]
        keys = BATCH_KEYS + tuple(k for k in OPTIONAL_BATCH_KEYS if k in samples[0])
        yield {key: torch.stack([torch.as_tensor(s[key]) for s in samples]) for key in keys}


def step_batches(source: SampleSource, step: int, global_batch_size: int, dp_rank: int, dp_size: int,
                 micro_batch_size: int) -> Iterator[dict]:
    """This DP rank's microbatches of optimizer step `step`."""
    per_rank = global_batch_size // dp_size
    return batches(source, step * global_batch_size + dp_rank * per_rank, micro_batch_size,
                   per_rank // micro_batch_size)


class Prefetcher:
    """The microbatches of each step from `start` on, built by a background thread one step ahead.

    While step i trains, the thread reads and stacks step i+1's samples (pinned when CUDA is
    available, so the engine's non-blocking copies overlap the step). Order is step_batches' own:
    a pure function of the step, so resuming at step i needs nothing but i. An error in the thread
    (a DataError, a read fault) is raised by `step` on the main thread, where it would have been."""

    def __init__(self, source: SampleSource, start: int, stop: int, global_batch_size: int, dp_rank: int,
                 dp_size: int, micro_batch_size: int, pin_memory: bool | None = None) -> None:
        self._args = (source, global_batch_size, dp_rank, dp_size, micro_batch_size)
        self._pin = torch.cuda.is_available() if pin_memory is None else pin_memory
        self._queue: queue.Queue = queue.Queue(maxsize=1)  # one step waiting: the next one is built meanwhile
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._fill, args=(start, stop), name="data-prefetch", daemon=True)
        self._thread.start()

    def _fill(self, start: int, stop: int) -> None:
        source, gbs, dp_rank, dp_size, mbs = self._args
        for step in range(start, stop):
            try:
                microbatches = [self._pinned(batch) for batch in step_batches(source, step, gbs, dp_rank, dp_size, mbs)]
                item = (step, microbatches, None)
            except BaseException as error:  # handed to the main thread, which raises it at this step
                item = (step, None, error)
            while not self._stopped.is_set():
                try:
                    self._queue.put(item, timeout=0.1)
                    break
                except queue.Full:  # the consumer is still on an earlier step
                    continue
            if self._stopped.is_set() or item[2] is not None:
                return

    def _pinned(self, batch: dict) -> dict:
        # position_length stays pageable: the sampler reads it on the host
        return {key: value.pin_memory() if self._pin and key != "position_length" else value
                for key, value in batch.items()}

    def step(self, step: int) -> Iterator[dict]:
        """This DP rank's microbatches of `step` (steps are asked for in order, from `start`)."""
        got, microbatches, error = self._queue.get()
        if error is not None:
            raise error
        if got != step:
            raise RuntimeError(f"data prefetch: step {step} asked for, step {got} prepared (steps must go in order)")
        return iter(microbatches)

    def close(self) -> None:
        """Stop the thread (it exits at its next put)."""
        self._stopped.set()
        self._thread.join(timeout=5.0)
