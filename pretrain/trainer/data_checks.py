"""Same-size damage to data_prep shards (bytes overwritten, size kept), caught in one line instead of a traceback
or silent training on garbage.

What it costs and what it catches:
- At start, every shard's `.idx` is read in full: its structure against its `.bin` (data_prep's own `check_pair`,
  the check `data_prep inspect` runs) and its sha256 against the manifest. An index holds about 20 bytes per
  document (a 500M-token corpus of ~1K-token documents: ~10 MB, hashed in well under a second). A `.bin` is only
  stat'ed there (Manifest.verify_shards): hashing it would re-read the whole corpus (1 GB per 500M uint16 tokens)
  at every start.
- Per sample: every token id against the tokenizer's vocabulary (a min and a max over the sample). Overwritten
  `.bin` bytes that decode to ids outside the vocabulary are named when first read, with the shard that holds
  them; overwritten bytes that happen to stay inside the vocabulary are not seen by the trainer (`data_prep
  inspect PREFIX` hashes every shard against the manifest and finds them).
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    from data_prep.manifest import Manifest


class SampleSource(Protocol):
    """Anything indexable into GPTDataset-style samples (pretrain.trainer.data's, not imported: data imports this)."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> dict: ...


class DataError(ValueError):
    """A data_prep build that cannot feed this run; the message names it and the fix."""


def _shards(manifest: "Manifest") -> list[tuple[str, dict]]:
    """(shard prefix, manifest entry) of every train shard and the validation stream."""
    entries = manifest.raw["shards"] + [manifest.raw["valid"]]
    return list(zip(manifest.train_prefixes + [manifest.valid_prefix], entries))


def check_indexes(manifests: list["Manifest"]) -> None:
    """Raise DataError naming the first `.idx` that is inconsistent with its `.bin` or differs from its manifest."""
    for manifest in manifests:
        _check_indexes(manifest)


def _check_indexes(manifest: "Manifest") -> None:
    from data_prep.checksums import sha256_file
    from data_prep.writer import check_pair
    fix = f"rebuild with `{manifest.rebuild_command()}` (add any other options of the original build)"
    for prefix, entry in _shards(manifest):
        problems = check_pair(prefix)
        if problems:
            raise DataError(f"{problems[0]} (damaged after the build; `python -m data_prep inspect "
                            f"{manifest.output_prefix}` lists every problem); {fix}")
        recorded = entry.get("idx_sha256")
        if recorded is not None and sha256_file(prefix + ".idx") != recorded:
            raise DataError(f"{prefix}.idx: sha256 differs from {manifest.path} (overwritten after the build); {fix}")


def _damaged_bins(manifest: "Manifest") -> list[str]:
    """The `.bin` files holding a token id outside the vocabulary (reads every shard: only on the error path)."""
    dtype = np.dtype(manifest.token_dtype or "int32")
    damaged = []
    for prefix, _ in _shards(manifest):
        if os.path.getsize(prefix + ".bin"):
            tokens = np.memmap(prefix + ".bin", dtype=dtype, mode="r")
            if int(tokens.max()) >= manifest.vocab_size or int(tokens.min()) < 0:
                damaged.append(prefix + ".bin")
    return damaged


class CheckedSamples:
    """A source whose every sample's token ids are checked against the vocabulary of the shards that fed it."""

    def __init__(self, source: "SampleSource", manifests: list["Manifest"]) -> None:
        self.source, self.manifests = source, manifests
        self.vocab_size = min(m.vocab_size for m in manifests)  # a blend shares one tokenizer (check_data_path)

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> dict:
        import torch  # here: a config check imports this module's DataError without torch

        sample = self.source[index]
        for key in ("tokens", "labels"):
            ids = torch.as_tensor(sample[key])
            if ids.numel():
                low, high = int(ids.min()), int(ids.max())
                if high >= self.vocab_size or low < 0:
                    self._refuse(index, high if high >= self.vocab_size else low)
        return sample

    def _refuse(self, index: int, token: int) -> None:
        damaged = [path for m in self.manifests for path in _damaged_bins(m)] or ["(none found on a re-read)"]
        rebuild = "; ".join(f"`{m.rebuild_command()}`" for m in self.manifests)
        error = DataError(f"sample {index} holds token id {token}, outside the tokenizer's vocabulary of "
                          f"{self.vocab_size}: shard {', '.join(damaged)} was overwritten after the build; "
                          f"rebuild with {rebuild}")
        if os.environ.get("RANK", "0") != "0":  # only this rank read the sample; rank 0 prints only its own errors
            print(f"error: {error}", file=sys.stderr, flush=True)
        raise error


def checked(train: "SampleSource", valid: "SampleSource | None",
            manifests: list["Manifest"]) -> tuple["SampleSource", "SampleSource | None"]:
    """The datasets built from `manifests`, with every sample's token ids checked against the vocabulary."""
    return CheckedSamples(train, manifests), None if valid is None else CheckedSamples(valid, manifests)
