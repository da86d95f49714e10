"""Issue 58's Transformer Engine battery: one command, inside 10 minutes once TE imports (benchmarks/gpu_te/device.sh).

  bash benchmarks/gpu_te/device.sh python3 benchmarks/gpu_te/battery.py --preset gpu [--data-prefix P]
  python benchmarks/gpu_te/battery.py --preset cpu-tiny      # the CPU dry run: every TE step SKIPs with its reason

Steps: `python -m pretrain selfcheck` (its four TE checks must PASS); each shipped method trained 20 steps in bf16
with TE layers against local layers with the same initial weights and batches (losses within BF16_TOL); TE's fused
RoPE against Megatron's unfused one at PosAug's α·i (max |Δ| of q and k, forward and backward); per-sample positions
(RFS) refused by the fused path with its reason logged, and trained unfused; FP8 (delayed, tensorwise) 20 steps with
a finite, falling loss; save and resume under TE (the trainer, a checkpoint at step 10, the same loss at step 20 as
a run straight through); HF export of the TE-trained model (logits against the Megatron model's); tokens/s of local
and TE layers for 10m and 113m. On the gpu preset a SKIP is a failure: the point is that TE runs.

Private reaches (megatron-core 0.16.1):
- megatron.core.models.common.embeddings.rope_utils._apply_rotary_pos_emb_bshd: Megatron's unfused RoPE, the
  reference for the fused kernel (the public apply_rotary_pos_emb picks one of the two from the config).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

TE_SELFCHECKS = ("TE vs local logits", "fused vs unfused RoPE, float positions", "FP8 step (Hopper)",
                 "113m step: tok/s, MFU")
BF16_TOL = 0.03  # relative |loss TE − loss local| at any of the steps: bf16 kernels differ, the math does not
ROPE_TOL = 1e-3  # fp32 q, k after RoPE at angles up to 8 × 2048 rad (sin/cos of large fp32 arguments)
EXPORT_TOL = 5e-3  # as selfcheck's TE vs local logits
ALPHA = 4.0


@dataclass(frozen=True)
class Scale:
    """What one battery preset trains."""

    model: str
    seq: int
    batch: int
    steps: int
    vocab: int
    gpu: bool


SCALES = {"gpu": Scale("10m", 2048, 8, 20, 4096, True), "cpu-tiny": Scale("tiny", 32, 4, 3, 256, False)}


class Skip(Exception):
    """A step that cannot run here: its reason."""


def te_missing() -> str | None:
    """Why TE cannot run here, or None."""
    import torch

    if not torch.cuda.is_available():
        return "no CUDA on this machine (TE's layers and kernels need a GPU)"
    try:
        import transformer_engine.pytorch  # noqa: F401
    except ImportError as error:
        return f"transformer_engine does not import ({error}): run it through benchmarks/gpu_te/device.sh"
    return None


def need_te() -> None:
    """Skip the calling step where TE cannot run."""
    reason = te_missing()
    if reason:
        raise Skip(reason)


def parse_selfcheck(text: str) -> dict[str, str]:
    """Check name -> status from selfcheck's table."""
    rows = {}
    for line in text.splitlines():
        match = re.match(r"(.+?)\s{2,}(PASS|FAIL|SKIP|INFO)\b", line)
        if match:
            rows[match.group(1).strip()] = match.group(2)
    return rows


def step_selfcheck(scale: Scale) -> str:
    """`python -m pretrain selfcheck`: its four TE checks PASS."""
    need_te()
    done = subprocess.run([sys.executable, "-m", "pretrain", "selfcheck"], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    rows = parse_selfcheck(done.stdout)
    bad = {name: rows.get(name, "missing") for name in TE_SELFCHECKS if rows.get(name) != "PASS"}
    if bad or done.returncode:
        raise AssertionError(f"selfcheck exit {done.returncode}; TE checks not PASS: {bad}\n{done.stdout[-2000:]}")
    return f"the four TE checks PASS ({sum(s == 'PASS' for s in rows.values())} PASS in all)"


def model_config(scale: Scale, method: str, impl: str, **overrides):
    """The scale's ModelConfig for `method` (its model fields) with layers `impl`."""
    from pretrain.table import METHODS, model_preset

    fields = {"seq_length": scale.seq, "vocab_size": scale.vocab, "transformer_impl": impl,
              "bf16": scale.gpu, **METHODS[method].model_fields(scale.seq), **overrides}
    return model_preset(scale.model, **fields)


def sampler_for(model, method: str, steps: int):
    """The method's position sampler (the trainer's, seed 0)."""
    from megatron_ext.positions import PositionConfig, build_sampler
    from pretrain.table import METHODS

    return build_sampler(PositionConfig(**METHODS[method].position_fields(model.seq_length)), seed=0,
                         train_seq_len=model.seq_length, num_layers=model.num_layers, rotary_dim=model.rotary_dim,
                         rotary_base=model.rotary_base, total_steps=steps)


def train(model, method: str, scale: Scale, init_from=None, steps: int | None = None):
    """(losses, seconds per step, engine) of `steps` optimizer steps on one repeated random batch, in process."""
    import torch

    from megatron_ext.model import ParallelConfig
    from pretrain.selfcheck import _batch, _same_weights
    from pretrain.trainer.config import OptimizerSettings
    from pretrain.trainer.engine import Engine

    steps = steps or scale.steps
    sampler = sampler_for(model, method, steps)
    torch.manual_seed(0)
    engine = Engine(model, ParallelConfig(), OptimizerSettings(lr=1e-3, min_lr=1e-3, lr_decay_style="constant"),
                    steps, per_sample_positions=sampler.needs_per_sample)
    if init_from is not None:  # the same initial weights as the local run (TE fuses the norms into its linears)
        _same_weights(init_from.model.module, engine.model.module)
        engine.optimizer.reload_model_params()  # bf16: the optimizer's fp32 copies follow the new weights
    batch = _batch(model, scale.batch)
    losses, times = [], []
    for step in range(steps):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        started = time.perf_counter()
        losses.append(engine.train_step(iter([batch]), sampler, step, 1, scale.batch, model.seq_length).loss)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    return losses, sum(times[1:]) / max(len(times) - 1, 1), engine


def step_methods(scale: Scale, state: dict) -> str:
    """Every shipped method: TE layers against local layers, same weights and batches, losses within BF16_TOL."""
    from pretrain.table import SHIPPED_METHODS

    methods = SHIPPED_METHODS if scale.gpu else ("baseline", "posaug")
    lines, worst = [], 0.0
    for method in methods:
        local_losses, _, local = train(model_config(scale, method, "local"), method, scale)
        if not all(math.isfinite(x) for x in local_losses):
            raise AssertionError(f"{method}: local losses {local_losses}")
        if te_missing():
            lines.append(f"{method}: local {local_losses[0]:.3f}→{local_losses[-1]:.3f}")
            continue
        te_losses, _, te = train(model_config(scale, method, "transformer_engine"), method, scale, init_from=local)
        gap = max(abs(a - b) / abs(b) for a, b in zip(te_losses, local_losses))
        worst = max(worst, gap)
        lines.append(f"{method}: local {local_losses[0]:.3f}→{local_losses[-1]:.3f}, TE {te_losses[-1]:.3f} "
                     f"(max rel Δ {gap:.1e})")
        if method == "posaug":
            state["te_engine"], state["te_model"] = te, model_config(scale, method, "transformer_engine")
    if te_missing():
        raise Skip(f"{te_missing()}; the local side trained: " + "; ".join(lines))
    if worst > BF16_TOL:
        raise AssertionError(f"a TE run left the local run's losses by {worst:.1e} > {BF16_TOL}: " + "; ".join(lines))
    return "; ".join(lines)


def step_fused_rope(scale: Scale) -> str:
    """TE's fused RoPE against Megatron's unfused one at PosAug's α·i: max |Δ| of q and k, forward and backward."""
    import torch
    from megatron.core.models.common.embeddings.rope_utils import _apply_rotary_pos_emb_bshd

    from megatron_ext.rope_hook import rotary_angles

    device = "cuda" if torch.cuda.is_available() else "cpu"
    generator = torch.Generator(device="cpu").manual_seed(0)
    s, b, h, d = scale.seq, 2, 4, 64
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float32, device=device) / d))
    freqs = rotary_angles(ALPHA * torch.arange(s, dtype=torch.float32, device=device), inv_freq)  # [s, 1, 1, d]
    tensors = {n: torch.randn(s, b, h, d, generator=generator).to(device) for n in ("q", "k", "grad")}
    unfused = {}
    for name in ("q", "k"):
        t = tensors[name].clone().requires_grad_()
        out = _apply_rotary_pos_emb_bshd(t, freqs, rotary_interleaved=False)
        out.backward(tensors["grad"])
        unfused[name] = (out.detach(), t.grad)
    need_te()
    from megatron.core.extensions.transformer_engine import fused_apply_rotary_pos_emb

    deltas = []
    for name in ("q", "k"):
        t = tensors[name].clone().requires_grad_()
        out = fused_apply_rotary_pos_emb(t, freqs, interleaved=False)
        out.backward(tensors["grad"])
        deltas += [(f"{name} fwd", (out.detach() - unfused[name][0]).abs().max().item()),
                   (f"{name} bwd", (t.grad - unfused[name][1]).abs().max().item())]
    text = ", ".join(f"{n} {v:.1e}" for n, v in deltas)
    if max(v for _, v in deltas) > ROPE_TOL:
        raise AssertionError(f"fused vs unfused RoPE at α = {ALPHA}: {text} (> {ROPE_TOL})")
    return f"α = {ALPHA}, s = {s}: max |Δ| {text}"


def step_per_sample(scale: Scale) -> str:
    """Per-sample positions (RFS) under TE: the fused path is refused with its reason logged; training runs."""
    from megatron_ext.model import transformer_config

    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("megatron_ext.model")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        config = transformer_config(model_config(scale, "rfs", "transformer_engine"), per_sample_positions=True)
    finally:
        logger.removeHandler(handler)
    reasons = [r.getMessage() for r in records if "unfused RoPE" in r.getMessage()]
    if config.apply_rope_fusion or not reasons:
        raise AssertionError(f"per-sample positions: apply_rope_fusion={config.apply_rope_fusion}, logged {reasons}")
    need_te()
    losses, _, _ = train(model_config(scale, "rfs", "transformer_engine"), "rfs", scale)
    if not all(math.isfinite(x) for x in losses):
        raise AssertionError(f"RFS under TE: losses {losses}")
    return f"refused to fuse ({reasons[0]!r}); RFS under TE unfused: loss {losses[0]:.3f}→{losses[-1]:.3f}"


def step_fp8(scale: Scale) -> str:
    """FP8 (delayed and tensorwise recipes) for 20 steps: finite, falling loss."""
    import torch

    need_te()
    if torch.cuda.get_device_capability() < (9, 0):
        raise Skip(f"FP8 needs compute capability 9.0+ (this GPU: {torch.cuda.get_device_capability()})")
    parts = []
    for recipe in ("delayed", "tensorwise"):
        model = model_config(scale, "posaug", "transformer_engine", fp8="hybrid", fp8_recipe=recipe)
        losses, _, _ = train(model, "posaug", scale)
        if not all(math.isfinite(x) for x in losses) or losses[-1] >= losses[0]:
            raise AssertionError(f"FP8 {recipe}: losses {losses}")
        parts.append(f"{recipe} {losses[0]:.3f}→{losses[-1]:.3f}")
    return "; ".join(parts)


def step_export(scale: Scale, state: dict) -> str:
    """HF export of the TE-trained PosAug model: its logits against the Megatron model's (fp32)."""
    import torch

    from megatron_ext.model import build_model
    from pretrain.hf.export import megatron_to_llama
    from pretrain.selfcheck import _batch

    need_te()
    if "te_engine" not in state:
        raise AssertionError("the methods step trained no TE PosAug model to export")
    trained = state["te_engine"].model.module
    fp32_config = state["te_model"].__class__(**{**vars(state["te_model"]), "bf16": False})
    model = build_model(fp32_config).cuda().eval()
    model.load_state_dict({k: v.float() if torch.is_tensor(v) and v.is_floating_point() else v
                           for k, v in trained.state_dict().items()}, strict=False)
    tokens = _batch(fp32_config, 2)["tokens"].cuda()
    positions = torch.arange(tokens.shape[1], dtype=torch.float32, device="cuda")
    hf = megatron_to_llama(model, fp32_config).cuda().eval()
    with torch.no_grad():
        ours = model(tokens, positions, None).float()[..., :fp32_config.vocab_size]
        theirs = hf(tokens).logits.float()
    diff = (ours - theirs).abs().max().item()
    if diff > EXPORT_TOL:
        raise AssertionError(f"HF export of the TE-trained model: max |Δlogits| {diff:.2e} > {EXPORT_TOL}")
    return f"max |Δlogits| {diff:.1e} (fp32, {tokens.shape[1]} positions)"


def step_save_resume(scale: Scale, data_prefix: str | None, out: Path) -> str:
    """Under TE, the trainer: 20 steps straight vs 10, saved, then resumed to 20; the same last loss."""
    need_te()
    if not data_prefix:
        raise Skip("needs --data-prefix (shards for the trainer)")
    import dataclasses

    import gpu_lease
    from pretrain.experiments.presets import PRESETS

    preset = dataclasses.replace(PRESETS["gpu-10m"], global_batch_size=16, micro_batch_size=16)
    common = ["model.transformer_impl=transformer_engine", "model.bf16=true", "optimizer.lr_decay_style=constant",
              "optimizer.lr_warmup_iters=1", "logging.log_interval=1"]
    straight = gpu_lease.write_config(out, preset, "posaug", 1, data_prefix, "straight",
                                      [*common, "schedule.train_iters=20", "checkpoint.save_interval=20"])
    first = gpu_lease.write_config(out, preset, "posaug", 1, data_prefix, "resumed",
                                   [*common, "schedule.train_iters=10", "checkpoint.save_interval=10"])
    codes = gpu_lease.wait_all({"straight": gpu_lease.train(straight, out / "logs" / "straight.log", 240),
                                "resumed": gpu_lease.train(first, out / "logs" / "resumed.log", 240)})
    second = gpu_lease.write_config(out, preset, "posaug", 1, data_prefix, "resumed",
                                    [*common, "schedule.train_iters=20", "checkpoint.save_interval=20"])
    codes["resumed again"] = gpu_lease.wait_all({"r": gpu_lease.train(second, out / "logs" / "resumed.log", 240)})["r"]
    if any(codes.values()):
        raise AssertionError(f"trainer exits {codes}; logs in {out / 'logs'}")
    last = {n: float(re.findall(r"step 20/20 \| loss ([0-9.]+)", (out / "logs" / f"{n}.log").read_text())[-1])
            for n in ("straight", "resumed")}
    if abs(last["straight"] - last["resumed"]) > BF16_TOL * last["straight"]:
        raise AssertionError(f"step-20 loss straight {last['straight']} vs resumed {last['resumed']}")
    return f"step-20 loss straight {last['straight']:.4f}, saved at 10 and resumed {last['resumed']:.4f}"


def step_throughput(scale: Scale) -> str:
    """Tokens/s of local and TE layers (bf16, s = 2048) for 10m and 113m: feeds `plan`'s calibration."""
    need_te()
    parts = []
    for size, batch in (("10m", 16), ("113m", 4)):
        for impl in ("local", "transformer_engine"):
            s = Scale(size, 2048, batch, 6, 32000, True)
            _, step_s, _ = train(model_config(s, "baseline", impl), "baseline", s)
            parts.append(f"{size} {impl}: {batch * 2048 / step_s / 1e3:.1f}K tok/s")
    return "; ".join(parts)


def run(scale: Scale, data_prefix: str | None, out: Path) -> list[tuple[str, str, str]]:
    """Every step, in order; (name, PASS | FAIL | SKIP, detail)."""
    from megatron_ext.model import ParallelConfig
    from pretrain.trainer import distributed

    state: dict = {}
    steps = [("selfcheck: the four TE checks", lambda: step_selfcheck(scale)),
             ("shipped methods, TE vs local, bf16", lambda: step_methods(scale, state)),
             ("fused vs unfused RoPE at α·i", lambda: step_fused_rope(scale)),
             ("per-sample positions (RFS) under TE", lambda: step_per_sample(scale)),
             ("FP8 delayed + tensorwise, 20 steps", lambda: step_fp8(scale)),
             ("HF export of the TE-trained model", lambda: step_export(scale, state)),
             ("save + resume under TE (trainer)", lambda: step_save_resume(scale, data_prefix, out)),
             ("tokens/s local vs TE, 10m and 113m", lambda: step_throughput(scale))]
    rows = []
    for name, step in steps[:1]:  # selfcheck initialises its own process groups
        rows.append(_run_step(name, step))
    distributed.initialize(ParallelConfig(), seed=0)
    try:
        for name, step in steps[1:]:
            rows.append(_run_step(name, step))
    finally:
        distributed.destroy()
    return rows


def _run_step(name: str, step) -> tuple[str, str, str]:
    started = time.time()
    try:
        status, detail = "PASS", step()
    except Skip as skip:
        status, detail = "SKIP", str(skip)
    except Exception as error:  # noqa: BLE001 - a failing step is a row; the battery goes on
        import traceback

        traceback.print_exc()
        status, detail = "FAIL", f"{type(error).__name__}: {error}".splitlines()[0][:400]
    print(f"[battery] {name}: {status} in {time.time() - started:.0f} s: {detail}", flush=True)
    return name, status, detail


def main(argv: list[str] | None = None) -> int:
    """Run the battery; write its table; exit 1 on a FAIL (and, on the gpu preset, on a SKIP)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", choices=sorted(SCALES), default="gpu")
    parser.add_argument("--data-prefix", default=None, help="shards for the save + resume step (the trainer)")
    parser.add_argument("--output", default=os.environ.get("OUT", "/tmp/te_battery"))
    args = parser.parse_args(argv)
    out = Path(args.output)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    scale = SCALES[args.preset]
    if scale.gpu and te_missing():  # every step would SKIP, after training 10m models on the CPU
        print(f"error: --preset gpu needs Transformer Engine on a GPU: {te_missing()}; the CPU dry run is "
              "--preset cpu-tiny", file=sys.stderr)
        return 2
    rows = run(scale, args.data_prefix, out / "battery_runs")
    width = max(len(r[0]) for r in rows)
    table = "\n".join(f"{n:<{width}}  {s:<4}  {d}" for n, s, d in rows)
    bad = [n for n, s, _ in rows if s == "FAIL" or (scale.gpu and s == "SKIP")]
    verdict = f"FAILED: {', '.join(bad)}" if bad else "battery passed" + ("" if scale.gpu else " (dry run)")
    (out / "te_battery.txt").write_text(table + "\n" + verdict + "\n")
    print(table + "\n" + verdict, flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
