"""The one place that patches Megatron-Core so it runs on a CPU-only torch build (gloo).

Megatron-Core assumes CUDA throughout. On a machine without CUDA, `apply()` installs seven
small patches; each names the Megatron call site it serves. An eighth only saves start-up time
(torch.optim without torch._dynamo, torch's own sites). With CUDA available, `apply()`
does nothing, so cluster runs use Megatron exactly as shipped. No other module of this
project patches Megatron: `rope_hook.py` subclasses GPTModel (overriding its private
`_preprocess`) and scales `softmax_scale` for the duration of a call, and
`pretrain/evaluation/scorers.py` reads attention internals; each lists those reaches in a
comment block at its top.

Call `apply()` before building models or process groups.

The import shims (megatron_ext/import_shims.py, installed when megatron_ext is imported) let megatron.core
import without triton and without torch._dynamo; that module says why.

Versions (megatron_ext/versions.py says which tests run on which): every patch and the import
shim are checked against megatron-core 0.16.1, 0.17.1, 0.18.2 and 0.19.2. No version string is
read: the private names patches 2-4 replace are megatron_ext.versions.REACHES, looked up here and
left alone when absent (build_model then names them); the import shim finds the module that
imports triton unguarded by reading Megatron's files; patch 6 changes nothing older releases call.
"""

from __future__ import annotations

import functools
import logging
import sys

import torch

from megatron_ext import import_shims

APPLIED: list[str] = []
_DEVICE_MODE: torch.overrides.TorchFunctionMode | None = None


def _fix_device(device: object) -> object:
    if isinstance(device, str) and device.startswith("cuda"):
        return "cpu"
    if isinstance(device, torch.device) and device.type == "cuda":
        return torch.device("cpu")
    if isinstance(device, int) and not isinstance(device, bool):
        return "cpu"  # .to(0) / device=0 mean "GPU 0" to Megatron
    return device


class CudaToCpuMode(torch.overrides.TorchFunctionMode):
    """Rewrites device="cuda"/.cuda()/.to(cuda) to CPU and makes Tensor.type() say torch.cuda.*.

    Serves ~30 hard-coded sites: pipeline schedules (total_num_tokens on "cuda"),
    optimizer/clip_grads (`assert grad.type() == 'torch.cuda.FloatTensor'`), the distributed
    optimizer's and Float16 wrapper's `param.type()` checks, DDP's param_and_grad_buffer.
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: D105
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            name = func(*args)
            return name if ".cuda." in name else name.replace("torch.", "torch.cuda.", 1)
        if "device" in kwargs:
            kwargs["device"] = _fix_device(kwargs["device"])
        if func is torch.Tensor.to and len(args) > 1:
            args = (args[0], _fix_device(args[1])) + tuple(args[2:])
        return func(*args, **kwargs)


def apply() -> list[str]:
    """Install the CPU patches once, only when CUDA is unavailable; returns their names."""
    if torch.cuda.is_available() or APPLIED:
        return APPLIED
    import_shims.install()

    # 1) ~175 sites allocate with device=torch.cuda.current_device(), and
    #    RotaryEmbedding.get_emb moves inv_freq there on the first forward.
    torch.cuda.current_device = lambda: "cpu"
    APPLIED.append("current_device")

    # 2) CudaRNGStatesTracker (model_parallel_cuda_manual_seed; get_cuda_rng_tracker().fork()
    #    around dropout and TP weight init) keeps CUDA RNG states. Map them to the CPU
    #    generator. torch.manual_seed must not be used here: it calls
    #    torch.cuda.manual_seed_all, which would recurse.
    import megatron.core.tensor_parallel.random as mcore_random

    from megatron_ext.versions import find

    torch.cuda.get_rng_state = lambda device="cuda": torch.get_rng_state()
    torch.cuda.manual_seed = lambda seed: torch.default_generator.manual_seed(int(seed))
    if find("cuda_rng_state"):
        mcore_random._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
    if find("set_cuda_rng_state"):
        mcore_random._set_cuda_rng_state = lambda new_state, *a, **k: torch.set_rng_state(new_state)
    # fork() warns on every use that the CPU RNG changed inside the "GPU" RNG context,
    # which here is the same generator by construction.
    logging.getLogger(mcore_random.__name__).setLevel(logging.ERROR)
    APPLIED.append("rng")

    # 3) transformer/utils.py:get_default_causal_mask (used by FusedScaleMaskSoftmax when
    #    attention_mask is None) hard-codes device="cuda".
    import megatron.core.fusions.fused_softmax as fused_softmax
    import megatron.core.transformer.utils as transformer_utils

    def get_default_causal_mask(sq: int) -> torch.Tensor:
        return torch.triu(torch.ones(sq, sq, dtype=torch.bool), diagonal=1)

    if find("causal_mask"):
        transformer_utils.get_default_causal_mask = get_default_causal_mask
    if find("softmax_causal_mask"):
        fused_softmax.get_default_causal_mask = get_default_causal_mask
    APPLIED.append("causal_mask")

    # 4) sequence_parallel with the local spec: WrappedTorchNorm asserts that torch norms do
    #    not support sequence parallel. A torch norm is correct on a sequence shard as long
    #    as its grads are all-reduced over TP, which finalize_model_grads does for params
    #    tagged `.sequence_parallel = True`.
    if find("wrapped_torch_norm"):
        _patch_wrapped_torch_norm()
        APPLIED.append("seqpar_norm")

    # 5) pipeline_parallel/p2p_communication.py calls torch.cuda.synchronize() after
    #    batched p2p (batch_p2p_sync) and in _communicate_shapes.
    torch.cuda.synchronize = lambda *a, **k: None
    APPLIED.append("synchronize")

    # 6) megatron-core >= 0.19: param_and_grad_buffer.start_grad_sync waits on
    #    torch.cuda.current_stream() for CUDA-graph events, and schedules enter
    #    torch.cuda.stream(...). torch.cpu provides the same no-op stream API.
    torch.cuda.current_stream = lambda *a, **k: torch.cpu.current_stream()
    torch.cuda.stream = torch.cpu.stream
    APPLIED.append("streams")

    # 7) The remaining hard-coded device="cuda"/.cuda()/.type() sites (see CudaToCpuMode).
    #    Entered for the life of the process; overhead is within noise on a 10M model step.
    global _DEVICE_MODE
    _DEVICE_MODE = CudaToCpuMode()
    _DEVICE_MODE.__enter__()
    APPLIED.append("device_mode")

    # 8) Not for correctness, for start-up: torch.optim imports torch._dynamo (0.59 CPU-s after megatron.core's
    #    import, benchmarks/bench_import_cost.py) on the first add_param_group and every step, only to tell a trace
    #    of torch.compile to skip or break there. Nothing is compiled on this path (see _optimizers_without_dynamo).
    if _optimizers_without_dynamo():
        APPLIED.append("optim_without_dynamo")
    return APPLIED


def _optimizers_without_dynamo() -> bool:
    """Patch 8 (see apply): torch.optim's dynamo wrappers become what they do outside a torch.compile trace.

    Private torch reaches, checked on torch 2.13 (the CPU pin; never on CUDA, where apply() does nothing):
    `torch._compile._disable_dynamo` wrappers look up `fn.__dynamo_disable` before importing torch._dynamo, so
    each wrapped optimizer function gets itself there (dynamo's `disable` only matters inside a trace); the
    `step` of Adam, AdamW and SGD (`torch.optim.optimizer._use_grad_for_differentiable`, `__wrapped__`) sets
    grad mode around the update and calls `torch._dynamo.graph_break()`, a no-op outside a trace: the
    replacement sets grad mode only. A torch whose wrappers have other code is left alone (False); a process
    that calls torch.compile still imports torch._dynamo then (the deferred Megatron fusions do on first call).
    """
    from torch._compile import _disable_dynamo
    from torch.optim import optimizer as optimizer_module

    disable_code = _disable_dynamo(lambda: None).__code__
    use_grad_code = optimizer_module._use_grad_for_differentiable(lambda: None).__code__
    if "fn" not in disable_code.co_freevars:
        return False
    seen: set[int] = set()

    def skip_dynamo_lookup(function) -> None:
        if id(function) in seen or not callable(function):
            return
        seen.add(id(function))
        code = getattr(function, "__code__", None)
        if code is disable_code:
            wrapped = function.__closure__[code.co_freevars.index("fn")].cell_contents
            if getattr(wrapped, "__dynamo_disable", None) is None:
                wrapped.__dynamo_disable = wrapped
            return
        for cell in getattr(function, "__closure__", None) or ():
            try:
                skip_dynamo_lookup(cell.cell_contents)
            except ValueError:  # an empty cell
                continue
        skip_dynamo_lookup(getattr(function, "__wrapped__", None))

    for name, module in list(sys.modules.items()):
        if name.startswith("torch.optim") and module is not None:
            for value in list(vars(module).values()):
                for candidate in vars(value).values() if isinstance(value, type) else (value,):
                    skip_dynamo_lookup(candidate)
    for cls in (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD):
        if getattr(cls.step, "__code__", None) is use_grad_code:
            cls.step = _step_without_graph_breaks(cls.step.__wrapped__)
    return True


def _step_without_graph_breaks(update):
    """An optimizer step as `_use_grad_for_differentiable` runs it outside a torch.compile trace."""

    @functools.wraps(update)
    def step(self, *args, **kwargs):
        grad_enabled = torch.is_grad_enabled()
        try:
            torch.set_grad_enabled(self.defaults.get("differentiable", False))
            return update(self, *args, **kwargs)
        finally:
            torch.set_grad_enabled(grad_enabled)

    return step


def _patch_wrapped_torch_norm() -> None:
    """Patch 4 (see apply)."""
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    original_new = WrappedTorchNorm.__new__

    def wrapped_norm_new(cls, config, hidden_size, eps=1e-5, **kwargs):
        sequence_parallel = config.sequence_parallel
        object.__setattr__(config, "sequence_parallel", False)
        try:
            norm = original_new(cls, config, hidden_size, eps, **kwargs)
        finally:
            object.__setattr__(config, "sequence_parallel", sequence_parallel)
        for param in norm.parameters():
            param.sequence_parallel = sequence_parallel
        return norm

    WrappedTorchNorm.__new__ = wrapped_norm_new
