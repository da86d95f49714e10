"""megatron.core imports without torch._dynamo (megatron_ext/import_shims.py): its torch.compile
decorations compile at their first call, as torch.compile itself does, and torch.compile is itself again after.
On CPU, torch.optim's optimizers step without importing torch._dynamo either (cpu_compat patch 8), to the same bits."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

from conftest import REPO
from megatron_ext.import_shims import deferred_compile


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


def fresh_interpreter(code: str, *args: str) -> dict:
    """The JSON that `code` prints last, run in a new Python (CPU only) whose first megatron.core import is its own."""
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONWARNINGS="ignore", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


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
    assert fresh_interpreter(IMPORT_MEGATRON) == {"dynamo": False, "restored": True, "jit_fuser_defers": True}


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
    assert fresh_interpreter(IMPORT_MEGATRON_THEN_WANDB) == {
        "imported_with_megatron": False, "megatron_sees": None, "importable_after": True}


OPTIMIZER_STEPS = """
import json, sys, torch
if sys.argv[1] == "patched":
    from megatron_ext import cpu_compat
    cpu_compat.apply()
torch.manual_seed(0)
results = {}
for name in ("Adam", "AdamW", "SGD"):
    weight = torch.nn.Parameter(torch.randn(4, 3))
    kwargs = {"momentum": 0.9} if name == "SGD" else {}
    optimizer = getattr(torch.optim, name)([weight], lr=0.1, weight_decay=0.01, **kwargs)
    for _ in range(3):
        optimizer.zero_grad()
        (weight ** 2).sum().backward()
        optimizer.step()
    optimizer.load_state_dict(optimizer.state_dict())
    optimizer.step()
    results[name] = {"weight": weight.detach().flatten().tolist(), "grad_mode_after": torch.is_grad_enabled()}
print(json.dumps({"dynamo": "torch._dynamo" in sys.modules, "results": results}))
"""



def test_cpu_optimizers_step_and_reload_without_importing_torch_dynamo_to_the_same_bits():
    patched, unpatched = fresh_interpreter(OPTIMIZER_STEPS, "patched"), fresh_interpreter(OPTIMIZER_STEPS, "unpatched")
    assert patched["dynamo"] is False and unpatched["dynamo"] is True
    assert patched["results"] == unpatched["results"]
