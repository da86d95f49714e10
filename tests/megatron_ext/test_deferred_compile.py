"""megatron.core imports without torch._dynamo (megatron_ext.cpu_compat's import shims): its torch.compile
decorations compile at their first call, as torch.compile itself does, and torch.compile is itself again after."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

from conftest import REPO
from megatron_ext.cpu_compat import deferred_compile


def recording_compile(calls: list):
    """A stand-in for torch.compile's compile step that records what it compiled and with which options."""

    def compile_now(model, **options):
        calls.append((model, options))
        return lambda *args, **kwargs: ("compiled", model(*args, **kwargs))

    return compile_now


def test_a_deferred_function_is_compiled_at_its_first_call_once_with_its_options():
    calls: list = []
    compile_later = deferred_compile(recording_compile(calls))

    def add(a, b):
        return a + b

    wrapped = compile_later(add, dynamic=False)
    assert calls == [] and wrapped.__name__ == "add"
    assert wrapped(1, 2) == ("compiled", 3) and wrapped(2, 2) == ("compiled", 4)
    assert calls == [(add, {"dynamic": False})]


def test_the_decorator_factory_form_defers_too():
    calls: list = []
    compile_later = deferred_compile(recording_compile(calls))

    @compile_later(fullgraph=True)
    def double(x):
        return 2 * x

    assert calls == []
    assert double(3) == ("compiled", 6) and calls[0][1] == {"fullgraph": True}


def test_a_module_is_compiled_at_once():
    calls: list = []
    layer = torch.nn.Linear(2, 2)
    deferred_compile(recording_compile(calls))(layer)
    assert calls == [(layer, {})]


IMPORT_MEGATRON = """
import json, sys, torch
compile_before = torch.compile
import megatron_ext
import megatron.core
from megatron.core import jit
print(json.dumps({"dynamo": "torch._dynamo" in sys.modules, "restored": torch.compile is compile_before,
                  "jit_fuser_defers": jit.jit_fuser is not compile_before}))
"""


def test_megatron_core_imports_without_torch_dynamo_and_torch_compile_is_restored():
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, "-c", IMPORT_MEGATRON], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == {"dynamo": False, "restored": True, "jit_fuser_defers": True}


IMPORT_MEGATRON_THEN_WANDB = """
import json, sys
import megatron_ext
import megatron.core
from megatron.core import timers
imported_with_megatron = "wandb" in sys.modules
import wandb
print(json.dumps({"imported_with_megatron": imported_with_megatron, "megatron_sees": timers.wandb,
                  "importable_after": hasattr(wandb, "init")}))
"""


def test_megatron_core_imports_without_wandb_and_wandb_imports_afterwards():
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, "-c", IMPORT_MEGATRON_THEN_WANDB], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == {"imported_with_megatron": False, "megatron_sees": None,
                                                        "importable_after": True}
