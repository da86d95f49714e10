"""The megatron-core versions this project is tested on, and every private Megatron name it reaches for.

setup.cfg's requirement, the Makefile's test environments and `constraints-cpu.txt` all name these
versions; tests/test_versions.py keeps them equal to the constants here.

No code path switches on a version string: each reach into Megatron-Core's private API (listed, with its
reason, at the top of the module that uses it) is a `Reach` in REACHES, looked up by name where it is used,
trying its candidates in order, so a release nobody listed still takes the right branch, and a Megatron
source tree on PYTHONPATH (no pip metadata) behaves like its wheel. `log_missing_reaches()` names every
reach the installed Megatron lacks, one line each, when a model is first built; `pretrain selfcheck`
exercises each reach on a tiny CPU model. Importing this module does not import megatron.core.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from packaging.version import InvalidVersion, Version

# What runs where in `make test` (the Makefile's MCORE_MATRIX, MATRIX_TESTS and NEWEST_CHECKPOINT_TESTS;
# tests/test_versions.py keeps the versions equal):
# - 0.16.1 (constraints-cpu.txt, the main .venv): the whole suite, fast and slow.
# - 0.17.1 and 0.18.2 (megatron-core alone in a small .venv-mcore-X whose .pth appends .venv's site-packages):
#   MATRIX_TESTS only: selfcheck (every reach exercised and PASS), a source tree without
#   pip metadata, a one-process checkpoint resumed under TP=2 and under PP=2, a save on SIGTERM, and HF export of
#   TP=1 and TP=2/PP=2 saves.
# - 0.19.2 (the same kind of environment): the fast suite, plus the slow checkpoint modules (NEWEST_CHECKPOINT_TESTS:
#   test_train.py, test_faults_checkpoint.py, the 0.16.1 -> 0.19.2 upgrade, test_hf_export_checkpoint.py) and the
#   source-tree test.
# Every other slow test (TP/PP/VPP equivalence, context parallel, the hangs, test_hf_import_architectures.py, the
# SLURM jobs, ...) runs on 0.16.1 only.
TESTED_MEGATRON_CORE = ("0.16.1", "0.17.1", "0.18.2", "0.19.2")
# The requirement setup.cfg states: from the oldest tested release up to the next minor after the newest.
MEGATRON_CORE_REQUIREMENT = ">=0.16.1,<0.20"

log = logging.getLogger(__name__)


class MissingReachError(RuntimeError):
    """The installed Megatron-Core lacks a private name this project needs."""


@dataclass(frozen=True)
class Reach:
    """One private Megatron-Core name we use: where it lives, the names tried in order, who uses it and why."""

    name: str  # how selfcheck and the start-up line call it
    owner: str  # the Megatron module holding it
    candidates: tuple[str, ...]  # dotted attribute paths inside `owner`, newest spelling first
    user: str  # our module that reaches for it
    why: str
    required: bool = True  # False: `user` runs without it, with the loss `why` describes

    def describe(self) -> str:
        """`owner.candidate` (or `owner.{a | b}`) for messages."""
        names = self.candidates[0] if len(self.candidates) == 1 else "{" + " | ".join(self.candidates) + "}"
        return f"{self.owner}.{names}"


def _reach(name, owner, candidates, user, why, required=True) -> Reach:
    return Reach(name, owner, tuple(candidates), user, why, required)


REACHES = {reach.name: reach for reach in (
    _reach("write_results_queue", "megatron.core.dist_checkpointing.strategies.filesystem_async",
           ["get_write_results_queue", "_get_write_results_queue"], "pretrain.trainer.checkpoint",
           "starts the checkpoint writer's helper process with SIGUSR1/SIGTERM blocked (without it, a preempted "
           "run's last save can fail)", required=False),
    _reach("gpt_preprocess", "megatron.core.models.gpt.gpt_model", ["GPTModel._preprocess"], "megatron_ext.rope_hook",
           "overridden to build RoPE angles from float positions"),
    _reach("cuda_rng_state", "megatron.core.tensor_parallel.random", ["_get_cuda_rng_state"],
           "megatron_ext.cpu_compat", "CUDA RNG states mapped to the CPU generator"),
    _reach("set_cuda_rng_state", "megatron.core.tensor_parallel.random", ["_set_cuda_rng_state"],
           "megatron_ext.cpu_compat", "CUDA RNG states mapped to the CPU generator"),
    _reach("causal_mask", "megatron.core.transformer.utils", ["get_default_causal_mask"],
           "megatron_ext.cpu_compat", "the default causal mask built on CPU"),
    _reach("softmax_causal_mask", "megatron.core.fusions.fused_softmax", ["get_default_causal_mask"],
           "megatron_ext.cpu_compat", "the default causal mask built on CPU"),
    _reach("wrapped_torch_norm", "megatron.core.transformer.torch_norm", ["WrappedTorchNorm.__new__"],
           "megatron_ext.cpu_compat", "torch norms under sequence parallelism on CPU"),
    _reach("optimizer_step_parts", "megatron.core.optimizer.optimizer", ["MegatronOptimizer.step_with_ready_grads"],
           "pretrain.trainer.optimizer_step", "optimizer.step() run as its parts (prepare_grads, clip, "
           "step_with_ready_grads) so the gradient norm and the skip check stay on the device"),
)}
# Attributes of a built model's modules (checked by check_model_reaches once a model exists).
MODEL_REACHES = {
    "rotary_inv_freq": ("megatron_ext.rope_hook, megatron_ext.model", "RotaryEmbedding",
                        ("inv_freq", "rotary_interleaved", "seq_len_interpolation_factor")),
    "softmax_scale": ("megatron_ext.rope_hook", "core attention (DotProductAttention)", ("softmax_scale",)),
    "attention_dropout": ("pretrain.evaluation.scorers", "DotProductAttention", ("attention_dropout",)),
}


def _lookup(root: object, dotted: str) -> object:
    for part in dotted.split("."):
        root = getattr(root, part)
    return root


def find(name: str) -> tuple[str, object] | None:
    """(the candidate found, its object) for REACHES[name], trying candidates in order; None when none exists."""
    reach = REACHES[name]
    try:
        owner = importlib.import_module(reach.owner)
    except ImportError:
        return None
    for candidate in reach.candidates:
        try:
            return candidate, _lookup(owner, candidate)
        except AttributeError:
            continue
    return None


def missing_line(name: str) -> str:
    """The one line that names a missing reach, the module using it, and what happens."""
    reach = REACHES[name]
    effect = "cannot run" if reach.required else "runs without it"
    return (f"megatron-core {megatron_core_version() or '(version unknown)'} lacks {reach.describe()}, which "
            f"{reach.user} uses ({reach.why}); {reach.user} {effect}: install megatron-core{MEGATRON_CORE_REQUIREMENT}")


def resolve(name: str) -> object:
    """The object REACHES[name] names in the installed Megatron; MissingReachError (one line) when absent."""
    found = find(name)
    if found is None:
        raise MissingReachError(missing_line(name))
    return found[1]


def core_attentions(model: object, *, local_only: bool = False) -> list:
    """The model's core attentions: Megatron's local DotProductAttention (and subclasses), and TE's unless local_only."""
    names = ("DotProductAttention",) if local_only else ("DotProductAttention", "TEDotProductAttention")
    return [m for m in model.modules() if any(k.__name__ in names for k in type(m).__mro__)]


def check_model_reaches(model: object) -> dict[str, str | None]:
    """For each MODEL_REACHES entry: None when the built model's modules carry it, else the one-line reason."""
    cores, local = core_attentions(model), core_attentions(model, local_only=True)
    rope = getattr(model, "position_embedding_type", "rope") == "rope"
    holders = {"rotary_inv_freq": [getattr(model, "rotary_pos_emb", None)] if rope else [],
               "softmax_scale": cores, "attention_dropout": local}
    version = megatron_core_version() or "(version unknown)"
    result = {}
    for name, (user, holder, attributes) in MODEL_REACHES.items():
        modules = holders[name]
        if None in modules or (name == "softmax_scale" and not modules):
            result[name] = f"megatron-core {version}: the model has no {holder}, which {user} reads"
            continue
        lacking = sorted({attribute for m in modules for attribute in attributes if not hasattr(m, attribute)})
        result[name] = f"megatron-core {version}: {holder} lacks {', '.join(lacking)}, which {user} reads" \
            if lacking else None
    return result


_LOGGED: set[str] = set()


def log_missing_reaches(model: object | None = None) -> list[str]:
    """Log one line per reach the installed Megatron lacks (once per process); returns the lines."""
    lines = [missing_line(name) for name in REACHES if find(name) is None]
    if model is not None:
        lines += [line for line in check_model_reaches(model).values() if line]
    for line in lines:
        if line not in _LOGGED:
            _LOGGED.add(line)
            log.error(line)
    return lines


def _source_tree_version() -> Version | None:
    """The version in megatron/core/package_info.py of the tree Python would import (read, not imported)."""
    try:
        spec = importlib.util.find_spec("megatron")
    except (ImportError, ValueError):
        return None
    for location in (spec.submodule_search_locations or []) if spec else []:
        info = Path(location) / "core" / "package_info.py"
        if info.is_file():
            fields = dict(re.findall(r"^(MAJOR|MINOR|PATCH|PRE_RELEASE)\s*=\s*['\"]?([^'\"\s]*)", info.read_text(),
                                     re.M))
            try:
                return Version(f"{fields['MAJOR']}.{fields['MINOR']}.{fields['PATCH']}{fields.get('PRE_RELEASE', '')}")
            except (KeyError, InvalidVersion):
                return None
    return None


def megatron_core_version() -> Version | None:
    """The version of the megatron.core Python imports: its package_info.py, else pip metadata; None if absent."""
    found = _source_tree_version()
    if found is not None:
        return found
    try:
        return Version(metadata.version("megatron-core"))
    except metadata.PackageNotFoundError:
        return None


def in_tested_range(version: Version | None = None) -> bool:
    """True when `version` (default: the installed one) lies within MEGATRON_CORE_REQUIREMENT."""
    from packaging.specifiers import SpecifierSet

    version = version if version is not None else megatron_core_version()
    return version is not None and SpecifierSet(MEGATRON_CORE_REQUIREMENT).contains(version, prereleases=True)
