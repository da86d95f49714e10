"""Import shims for megatron.core, installed when megatron_ext is imported, before anything imports megatron.core.

This module imports nothing heavy (no torch): `python -m pretrain train --check`, `plan` and the launchers' dry runs
import megatron_ext for its configs and never pay for torch. The finder below imports torch itself when
megatron.core is first imported (megatron.core imports torch anyway).

The import shims also defer torch.compile while megatron.core imports, on every machine: Megatron
decorates ~40 fusion functions with torch.compile at import (megatron/core/jit.py `jit_fuser`), and the
first torch.compile call imports torch._dynamo, ~5 of the ~7.5 CPU-seconds `import megatron.core` costs
(measured on 2 cores: 9.3 s user with, 4.5 s without; torch alone 2.3 s). Each decorated function gets a
wrapper that calls torch.compile on its first call, which is when torch.compile compiles anyway, so a
run that calls a fusion compiles it as before and one that never does (the local layers, every CPU run)
never pays for torch._dynamo. torch.compile is itself again once megatron.core has imported. For the same
import, `wandb` is hidden unless something imported it before (0.46 of the 4.15 CPU-seconds left;
benchmarks/bench_import_cost.py): megatron.core
imports it optionally (timers.py, inference/contexts/dynamic_context.py, inference/engines/dynamic_engine.py) for
Megatron's own timer and inference logging, which this project never calls; its W&B tracking
(pretrain/trainer/tracking.py) imports wandb itself, after which `import wandb` works as usual.

Versions: checked against megatron-core 0.16.1, 0.17.1, 0.18.2 and 0.19.2 (megatron_ext/cpu_compat.py's list).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import sys
import types
from pathlib import Path

# megatron-core 0.18 and 0.19 import triton at import time (0.19: transformer/moe/ops/paged_stash.py,
# 0.18: transformer/moe/paged_stash.py itself), reached from megatron.core.__init__ via
# pipeline_parallel.schedules. Stubbing `triton` itself breaks torch._dynamo, so only the Megatron
# module whose file imports triton unguarded is pre-registered: the first of these that does.
_PAGED_STASH_CANDIDATES = ("megatron.core.transformer.moe.ops.paged_stash", "megatron.core.transformer.moe.paged_stash")


def _imports_triton_unguarded(module: str) -> bool:
    """True when `module`'s file (found without importing megatron.core) has a top-level `import triton`."""
    try:
        spec = importlib.util.find_spec("megatron")
    except (ImportError, ValueError):
        return False
    for root in (spec.submodule_search_locations or []) if spec else []:
        path = Path(root, *module.split(".")[1:]).with_suffix(".py")
        if path.is_file():
            return any(line.startswith(("import triton", "from triton")) for line in path.read_text().splitlines())
    return False


def install_triton_stub() -> bool:
    """Let megatron-core 0.18+ import without triton (a no-op for 0.16/0.17 or when triton exists)."""
    if importlib.util.find_spec("triton") is not None:
        return False
    target = next((m for m in _PAGED_STASH_CANDIDATES if m in sys.modules or _imports_triton_unguarded(m)), None)
    if target is None or target in sys.modules:
        return False
    stub = types.ModuleType(target)
    stub.GLOBAL_BLOCK_SIZE = 1024

    def _needs_triton(*_args, **_kwargs):
        raise RuntimeError("paged-stash MoE (moe_paged_stash) needs triton and CUDA")

    # Every other name Megatron imports from it (kernels, paged_stash_reset, ...) is that refusal; Megatron
    # calls them only with config.moe_paged_stash, which this project never sets.
    stub.__getattr__ = lambda name: _needs_triton if not name.startswith("__") else _no_attribute(target, name)
    sys.modules[target] = stub
    return True


def _no_attribute(module: str, name: str):
    raise AttributeError(f"module {module!r} has no attribute {name!r}")


def deferred_compile(compile_now):
    """torch.compile that compiles a function at its first call instead of at decoration (modules at once)."""

    def compile_later(model=None, **options):
        if model is None:  # @torch.compile(...) used as a decorator factory
            return lambda function: compile_later(function, **options)
        import torch

        if isinstance(model, torch.nn.Module):
            return compile_now(model, **options)
        compiled = None

        @functools.wraps(model)
        def first_call_compiles(*args, **kwargs):
            nonlocal compiled
            if compiled is None:
                compiled = compile_now(model, **options)
            return compiled(*args, **kwargs)

        return first_call_compiles

    return compile_later


class _DeferCompileWhileMegatronImports(importlib.abc.MetaPathFinder):
    """Finds megatron.core with the other finders and runs its import with torch.compile deferred."""

    def find_spec(self, name, path=None, target=None):  # noqa: D102
        if name != "megatron.core":
            return None
        sys.meta_path.remove(self)  # once: the first import of megatron.core is the one that decorates
        import torch

        install_triton_stub()
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_with_deferred_compile(module):
            compile_now = torch.compile
            torch.compile = deferred_compile(compile_now)
            hide_wandb = "wandb" not in sys.modules
            if hide_wandb:
                sys.modules["wandb"] = None  # `import wandb` raises ImportError: Megatron's optional-import branch
            try:
                exec_module(module)
            finally:
                torch.compile = compile_now
                if hide_wandb and sys.modules.get("wandb", False) is None:
                    del sys.modules["wandb"]

        spec.loader.exec_module = exec_with_deferred_compile
        return spec


def install() -> bool:
    """Before the first import of megatron.core: the triton stub and torch.compile deferred while it imports;
    False when megatron.core has been imported already."""
    if "megatron.core" in sys.modules or any(isinstance(f, _DeferCompileWhileMegatronImports) for f in sys.meta_path):
        return False
    sys.meta_path.insert(0, _DeferCompileWhileMegatronImports())
    return True
