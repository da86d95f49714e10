"""data.data_path: one data_prep prefix or a blend, and the checks that each has a manifest and a complete build
(no torch: a config check imports this, not the data pipeline)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pretrain.trainer.config_values import shown
from pretrain.trainer.data_checks import DataError

if TYPE_CHECKING:
    from data_prep.manifest import Manifest


def parse_blend(data_path: str | list) -> list[tuple[float, str]]:
    """[(weight, prefix)] of data.data_path: one prefix, or Megatron's blend [w1, prefix1, w2, prefix2, ...]."""
    if isinstance(data_path, str):
        return [(1.0, data_path)]
    items = list(data_path)
    if any(isinstance(item, (list, tuple, dict)) for item in items):
        raise ValueError(f"data.data_path must be a data_prep prefix or a flat list [weight, prefix, ...], got a "
                         f"nested list {shown(data_path)}")
    if len(items) == 1 and isinstance(items[0], str):
        return [(1.0, items[0])]
    if not items or len(items) % 2:
        raise ValueError(f"data.data_path={shown(data_path)}: a blend alternates weights and data_prep prefixes, "
                         "e.g. [0.7, data/web, 0.3, data/code]")
    parts = []
    for raw_weight, prefix in zip(items[::2], items[1::2]):
        try:
            weight = float(raw_weight)
        except (TypeError, ValueError):
            weight = float("nan")
        if not 0 < weight < float("inf") or not isinstance(prefix, str):
            raise ValueError(f"data.data_path: blend entry ({shown(raw_weight)}, {shown(prefix)}) needs a positive "
                             "weight followed by a data_prep prefix, e.g. [0.7, data/web, 0.3, data/code]")
        parts.append((weight, prefix))
    return parts


def check_data_path(data_path: str | list) -> None:
    """ValueError naming the fix unless every prefix of data.data_path has a manifest, all with one tokenizer."""
    from data_prep.manifest import load_manifest, manifest_path

    parts = parse_blend(data_path)
    for _, prefix in parts:
        if not Path(manifest_path(prefix)).is_file():
            raise ValueError(f"data.data_path: no manifest for {prefix!r} at {manifest_path(prefix)}; "
                             "run `python -m data_prep build --data-prefix ...` first")
    if len(parts) > 1:
        manifests = [(prefix, load_manifest(prefix)) for _, prefix in parts]
        first_prefix, first = manifests[0]
        for prefix, manifest in manifests[1:]:
            if (manifest.tokenizer_sha256, manifest.vocab_size, manifest.eod_id) != \
                    (first.tokenizer_sha256, first.vocab_size, first.eod_id):
                raise ValueError(f"data.data_path: {prefix!r} was tokenized with {manifest.tokenizer_path} and "
                                 f"{first_prefix!r} with {first.tokenizer_path} (tokenizer sha256 differs); "
                                 "blend only data_prep outputs built with the same tokenizer")


def check_build(data_path: str, seq_length: int) -> Manifest:
    """The data_prep Manifest of `data_path`, once it holds a training sequence and every shard file it lists
    is there with its recorded size; raises DataError naming the file and the fix."""
    from data_prep.manifest import load_manifest, manifest_path

    try:
        manifest = load_manifest(data_path)
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise DataError(f"data.data_path={data_path!r}: its manifest {manifest_path(data_path)} is unreadable "
                        f"({type(error).__name__}: {error}); rebuild it with `python -m data_prep build ... "
                        f"--data-prefix {data_path}`") from None
    if manifest.num_tokens < seq_length + 1:
        raise DataError(f"data.data_path={data_path!r} holds {manifest.num_tokens} training tokens, fewer than one "
                        f"sequence (model.seq_length + 1 = {seq_length + 1}); build it from more text, or lower "
                        "model.seq_length")
    try:
        manifest.verify_shards()  # sizes only: hashing every shard at each start would cost minutes
    except ValueError as error:
        raise DataError(f"data.data_path={data_path!r}: {error}") from None
    return manifest
