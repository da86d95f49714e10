"""`python -m pretrain selfcheck`: a pass/fail table for a new machine.

CPU part (runs everywhere, also in the test suite): library versions, devices, a 5-step
tiny training through Megatron-Core with the local layers, tokens/s and MFU of that step, and
one PASS/FAIL row per private Megatron reach, each exercised (pretrain/selfcheck_reaches.py):
the version string is shown, never trusted.
CUDA part (each check skipped with "no CUDA" without a GPU): Transformer Engine vs local
logits on the same weights, fused vs unfused RoPE with float positions ([s] vs [b, s] with
equal rows), bf16 vs fp32 loss, one FP8 step on Hopper, tokens/s and MFU of a 113m step.
The CUDA checks are deliberately thin and have not been run on a GPU by the authors yet.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
import time
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    import torch  # annotations only: the checks import torch when they run, so `--help` does not

PACKAGES = ("torch", "megatron-core", "transformer-engine", "apex", "transformers")
REQUIRED = ("torch", "megatron-core")


@dataclass
class Check:
    """One line of the table."""

    name: str
    status: str  # PASS | FAIL | SKIP | INFO
    detail: str


class Skip(Exception):
    """A check that does not apply here (the message says why)."""


def _tiny_model(**overrides):
    from pretrain.table import model_preset

    return model_preset("tiny", **overrides)


def _batch(model, batch_size: int = 4, seed: int = 0) -> dict:
    import torch

    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, model.vocab_size, (batch_size, model.seq_length + 1), generator=generator)
    return {"tokens": tokens[:, :-1], "labels": tokens[:, 1:], "loss_mask": torch.ones(batch_size, model.seq_length)}


def _train_steps(model, steps: int, batch_size: int, lr: float = 3e-3) -> tuple[list[float], float]:
    """(losses, seconds per step after the first) of `steps` optimizer steps on one repeated batch."""
    import torch

    from megatron_ext.model import ParallelConfig
    from megatron_ext.positions import PositionConfig, build_sampler
    from pretrain.trainer.config import OptimizerSettings
    from pretrain.trainer.engine import Engine

    torch.manual_seed(0)
    engine = Engine(model, ParallelConfig(), OptimizerSettings(lr=lr, min_lr=lr, lr_decay_style="constant"), steps)
    sampler = build_sampler(PositionConfig(strategy="posaug"), seed=0, train_seq_len=model.seq_length,
                            num_layers=model.num_layers, rotary_dim=model.rotary_dim,
                            rotary_base=model.rotary_base, total_steps=steps)
    batch = _batch(model, batch_size)
    losses, times = [], []
    for step in range(steps):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        losses.append(engine.train_step(iter([batch]), sampler, step, 1, batch_size, model.seq_length).loss)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return losses, sum(times[1:]) / max(len(times) - 1, 1)


# ------------------------------------------------------------------------------- CPU part


def check_versions() -> str:
    """Installed versions; torch and megatron-core are required, the rest optional."""
    found = {}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    missing = [name for name in REQUIRED if found[name] is None]
    if missing:
        raise AssertionError(f"missing required package(s) {missing}: pip install -e .")
    python = f"Python {sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}"
    return ", ".join([python] + [f"{name} {version or '—'}" for name, version in found.items()])


def check_megatron_core_range() -> str:
    """Which megatron-core is imported, and whether the tested range holds it (information: the reach rows decide)."""
    from megatron_ext.versions import MEGATRON_CORE_REQUIREMENT, TESTED_MEGATRON_CORE, in_tested_range, \
        megatron_core_version

    installed = megatron_core_version()
    where = "tested" if str(installed) in TESTED_MEGATRON_CORE else \
        "within the range, untested" if in_tested_range(installed) else "OUTSIDE the range"
    return f"{installed or 'unknown'}: {where} ({MEGATRON_CORE_REQUIREMENT}; tested: {', '.join(TESTED_MEGATRON_CORE)})"


def check_devices() -> str:
    """CPU threads and CUDA devices."""
    import torch

    text = f"CPU: {torch.get_num_threads()} threads"
    if torch.cuda.is_available():
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        text += f"; CUDA {torch.version.cuda}: " + ", ".join(names)
    else:
        text += "; no CUDA device"
    return text


def check_tiny_training() -> str:
    """5 steps of the tiny model (local layers, fp32, PosAug positions): finite, decreasing loss; tok/s, MFU."""
    import torch

    model = _tiny_model(transformer_impl="local", bf16=False)
    losses, step_s = _train_steps(model, steps=5, batch_size=4)
    if not all(torch.isfinite(torch.tensor(losses))):
        raise AssertionError(f"non-finite loss: {losses}")
    if not losses[-1] < losses[0]:
        raise AssertionError(f"loss did not decrease over 5 steps on one batch: {losses}")
    tokens_per_s = 4 * model.seq_length / step_s
    return f"loss {losses[0]:.3f} → {losses[-1]:.3f}; {tokens_per_s / 1e3:.1f}K tok/s, " + _mfu_text(model, 4, tokens_per_s)


def _mfu_text(model, micro_batch_size: int, tokens_per_s: float) -> str:
    """MFU against the device's peak and where the peak came from; an impossible MFU is not printed."""
    from megatron_ext.model_config import model_flops_utilization
    from pretrain.trainer.peak import device_peak, plausible_mfu

    peak = device_peak(None, model, micro_batch_size)
    mfu = model_flops_utilization(model.flops_per_token(), tokens_per_s, peak.tflops)
    shown = f"MFU {100 * mfu:.3g}%" if plausible_mfu(mfu) else f"MFU not shown ({100 * mfu:.3g}% is impossible)"
    return f"{shown} (peak {peak.tflops:.4g} TFLOP/s, {peak.describe()})"


def check_sdpa_vs_megatron_attention() -> str:
    """Local layers: SDPA core attention and Megatron's DotProductAttention, same weights, same logits (fp32)."""
    import torch

    from megatron_ext.model import build_model

    device = "cuda" if torch.cuda.is_available() else "cpu"
    models = []
    for core_attention in ("megatron", "sdpa"):
        torch.manual_seed(0)  # the same initial weights
        models.append(build_model(_tiny_model(transformer_impl="local", bf16=False,
                                              core_attention=core_attention)).to(device).eval())
    tokens = _batch(_tiny_model())["tokens"].to(device)
    positions = torch.arange(tokens.shape[1], dtype=torch.float32, device=device) * 2.5
    diff = (_logits(models[0], tokens, positions) - _logits(models[1], tokens, positions)).abs().max().item()
    if diff > 1e-4:
        raise AssertionError(f"max |logits SDPA − Megatron| = {diff:.2e} > 1e-4 on {device}")
    return f"max |Δlogits| {diff:.1e} on {device}"


# ------------------------------------------------------------------------------ CUDA part


def _need_cuda(te: bool = True) -> None:
    import torch

    if not torch.cuda.is_available():
        raise Skip("no CUDA")
    if te:
        try:
            import transformer_engine  # noqa: F401
        except ImportError:
            raise Skip("transformer-engine not installed (pip install '.[gpu]')") from None


def _logits(module, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    import torch

    with torch.no_grad():
        return module(tokens, positions, None).float()


def _same_weights(source, target) -> None:
    """Copy a local-spec model's weights into a TE-spec model (TE fuses the norms into the next linear)."""
    renames = {"input_layernorm.weight": "self_attention.linear_qkv.layer_norm_weight",
               "pre_mlp_layernorm.weight": "mlp.linear_fc1.layer_norm_weight"}
    state = {}
    for name, value in source.state_dict().items():
        if "_extra_state" in name:
            continue
        for old, new in renames.items():
            if name.endswith(old):
                name = name[: -len(old)] + new
        state[name] = value
    missing, unexpected = target.load_state_dict(state, strict=False)
    missing = [m for m in missing if "_extra_state" not in m]
    if missing or unexpected:
        raise AssertionError(f"weight mapping local → TE: missing {missing}, unexpected {unexpected}")


def check_te_vs_local() -> str:
    """Transformer Engine layers and local layers with the same weights give the same logits (fp32)."""
    import torch

    _need_cuda()
    from megatron_ext.model import build_model

    local = build_model(_tiny_model(transformer_impl="local")).cuda().eval()
    te = build_model(_tiny_model(transformer_impl="transformer_engine")).cuda().eval()
    _same_weights(local, te)
    tokens = _batch(_tiny_model())["tokens"].cuda()
    positions = torch.arange(tokens.shape[1], dtype=torch.float32, device="cuda") * 2.5
    diff = (_logits(local, tokens, positions) - _logits(te, tokens, positions)).abs().max().item()
    if diff > 5e-3:
        raise AssertionError(f"max |logits TE − local| = {diff:.2e} > 5e-3")
    return f"max |Δlogits| {diff:.1e}"


def check_fused_vs_unfused_rope() -> str:
    """Float positions α·i as [s] (TE fused RoPE) and as [b, s] with equal rows (unfused) agree."""
    import torch

    _need_cuda()
    from megatron_ext.model import build_model

    model = _tiny_model(transformer_impl="transformer_engine")
    fused = build_model(model).cuda().eval()
    unfused = build_model(model, per_sample_positions=True).cuda().eval()
    unfused.load_state_dict(fused.state_dict())
    tokens = _batch(model)["tokens"].cuda()
    positions = torch.arange(tokens.shape[1], dtype=torch.float32, device="cuda") * 3.7
    diff = (_logits(fused, tokens, positions)
            - _logits(unfused, tokens, positions[None].expand(tokens.shape[0], -1).contiguous())).abs().max().item()
    if diff > 5e-3:
        raise AssertionError(f"max |logits fused − unfused| = {diff:.2e} > 5e-3")
    return f"max |Δlogits| {diff:.1e}"


def check_bf16_vs_fp32() -> str:
    """The same weights give the same loss in bf16 and fp32 (within bf16 precision)."""
    import torch

    _need_cuda(te=False)
    from megatron_ext.model import build_model

    fp32 = build_model(_tiny_model()).cuda().eval()
    bf16 = build_model(_tiny_model(bf16=True)).cuda().eval()
    # Megatron's state dicts hold `_extra_state` entries (None for local layers) beside the tensors
    bf16.load_state_dict({k: v.to(torch.bfloat16) if torch.is_tensor(v) and v.is_floating_point() else v
                          for k, v in fp32.state_dict().items()}, strict=False)
    batch = {k: v.cuda() for k, v in _batch(_tiny_model()).items()}
    positions = torch.arange(batch["tokens"].shape[1], dtype=torch.float32, device="cuda")
    with torch.no_grad():
        losses = [m(batch["tokens"], positions, None, labels=batch["labels"]).float().mean().item()
                  for m in (fp32, bf16)]
    if abs(losses[0] - losses[1]) > 0.02 * abs(losses[0]):
        raise AssertionError(f"loss fp32 {losses[0]:.4f} vs bf16 {losses[1]:.4f} differ by > 2 %")
    return f"loss fp32 {losses[0]:.4f}, bf16 {losses[1]:.4f}"


def check_fp8_step() -> str:
    """One FP8 (hybrid, delayed scaling) training step gives a finite loss (Hopper or newer)."""
    import torch

    _need_cuda()
    if torch.cuda.get_device_capability() < (9, 0):
        raise Skip(f"FP8 needs compute capability 9.0+, this GPU has {torch.cuda.get_device_capability()}")
    # FP8 GEMMs need dimensions that are multiples of 16.
    model = _tiny_model(transformer_impl="transformer_engine", bf16=True, fp8="hybrid", vocab_size=256)
    losses, _ = _train_steps(model, steps=2, batch_size=16)
    if not all(torch.isfinite(torch.tensor(losses))):
        raise AssertionError(f"non-finite FP8 loss: {losses}")
    return f"losses {losses}"


def check_113m_throughput() -> str:
    """Tokens/s and MFU of a 113m training step (TE, bf16, micro-batch 4, s = 2048)."""
    _need_cuda()
    from pretrain.table import model_preset

    model = model_preset("113m", transformer_impl="transformer_engine", bf16=True)
    _, step_s = _train_steps(model, steps=4, batch_size=4, lr=3e-4)
    tokens_per_s = 4 * model.seq_length / step_s
    return f"{tokens_per_s / 1e3:.1f}K tok/s, " + _mfu_text(model, 4, tokens_per_s)


CPU_CHECKS: dict[str, Callable[[], str]] = {
    "versions": check_versions, "megatron-core range": check_megatron_core_range, "devices": check_devices,
    "tiny training (local, 5 steps)": check_tiny_training,
    "local attention: SDPA vs Megatron": check_sdpa_vs_megatron_attention}
CUDA_CHECKS: dict[str, Callable[[], str]] = {
    "TE vs local logits": check_te_vs_local, "fused vs unfused RoPE, float positions": check_fused_vs_unfused_rope,
    "bf16 vs fp32 loss": check_bf16_vs_fp32, "FP8 step (Hopper)": check_fp8_step,
    "113m step: tok/s, MFU": check_113m_throughput}


def run_checks(cuda: bool = True) -> list[Check]:
    """Run every check (the CUDA ones skip themselves without a GPU); never raises."""
    from megatron_ext.model import ParallelConfig
    from pretrain.trainer import distributed

    results = []
    distributed.initialize(ParallelConfig(), seed=0)
    try:
        for name, check in {**CPU_CHECKS, **(CUDA_CHECKS if cuda else {})}.items():
            try:
                detail = check()
                status = "INFO" if name in ("versions", "megatron-core range", "devices") else "PASS"
            except Skip as skip:
                status, detail = "SKIP", str(skip)
            except Exception as error:  # noqa: BLE001 - a failing check is a table row, not a crash
                status = "FAIL"
                detail = f"{type(error).__name__}: {error}".splitlines()[0][:300]
                traceback.print_exc(file=sys.stderr)
            results.append(Check(name, status, detail))
        from pretrain.selfcheck_reaches import reach_rows

        results += [Check(*row) for row in reach_rows(_tiny_model(transformer_impl="local", bf16=False), _batch(
            _tiny_model()))]
    finally:
        distributed.destroy()
    return results


def format_table(results: list[Check]) -> str:
    """Fixed-width table: check, status, detail."""
    width = max(len(r.name) for r in results)
    return "\n".join(f"{r.name:<{width}}  {r.status:<4}  {r.detail}" for r in results)


def main(argv: list[str]) -> int:
    """CLI for `python -m pretrain selfcheck`; exit 1 when any check fails."""
    from pretrain.cli import Parser

    parser = Parser(prog="python -m pretrain selfcheck", description=__doc__.split("\n")[0])
    parser.add_argument("--cpu-only", action="store_true", help="skip the CUDA checks even on a GPU machine")
    args = parser.parse_args(argv)
    results = run_checks(cuda=not args.cpu_only)
    print(format_table(results))
    failed = [r.name for r in results if r.status == "FAIL"]
    print(f"{'FAILED: ' + ', '.join(failed) if failed else 'all checks passed'} "
          f"({sum(r.status == 'SKIP' for r in results)} skipped)")
    return 1 if failed else 0
