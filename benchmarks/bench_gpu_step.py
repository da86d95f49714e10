"""Today's training step against each change of issue 60 and all of them together, side by side in one process.

    .venv/bin/python benchmarks/bench_gpu_step.py --preset 10m|113m|cpu-tiny [--rounds 3] [--steps-per-round 4]
        [--output DIR] [--set KEY=VALUE ...] [--variants NAME ...]

Per variant: tokens/s (median over rounds; each round runs the variant's steps back to back with no host wait
between them, as the training loop does, and the rounds go round-robin over the variants so drift in the machine's
load hits every variant alike), MFU by megatron_ext.model_config.FLOP_CONVENTION (PaLM's count) and, beside it,
counting causal attention once, device->host syncs per step (a TorchDispatchMode counting
aten._local_scalar_dense), kernel launches per step (torch.profiler: CUDA kernel events; on a CPU there are
none, so CPU aten ops are counted and the table says so), and a 3-step chrome trace per variant (gzipped JSON,
open in Perfetto or chrome://tracing). Writes bench.json, table.txt and the traces to --output.

The engines are built as `python -m pretrain train` builds them (pretrain.trainer.config.load with the overrides,
build_sampler, Engine, SyntheticTokens, step_batches or the trainer's Prefetcher), on synthetic tokens.
Presets: 10m and 113m are the shipped configs (vocabulary 50,257 padded to 50,304, w = 2048, bf16, local layers
and SDPA, the distributed optimizer) with global batch 128; cpu-tiny is a seconds-long dry run of the same code.

A variant whose switch is not a field of this build's config is listed as 'not available in this build' and
skipped; 'all together' takes every available switch. Switches marked CUDA_ONLY are skipped without a GPU.

What each column counts, and the one private torch API that reaches it: benchmarks/step_measures.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from step_measures import TRACE_STEPS, count_syncs, profile, timed_block  # noqa: E402

# ---- the variants: name -> overrides on top of TODAY --------------------------------------------------------------
# The host-sync change has no switch: every row, `today` included, runs the one-sync step (its column shows it).
TODAY = {"data.prefetch": "false", "model.compile": "false", "model.rope_kernel": "unfused",
         "model.cross_entropy_loss_fusion": "false", "optimizer.adam_fused": "false"}
VARIANTS: dict[str, dict[str, str]] = {
    "today": {},
    "prefetch": {"data.prefetch": "true"},
    "compile": {"model.compile": "true"},
    "rope kernel": {"model.rope_kernel": "triton"},
    "fused cross-entropy": {"model.cross_entropy_loss_fusion": "true"},
    "fused AdamW": {"optimizer.adam_fused": "true"},
}
ALL_TOGETHER = "all together"  # every available switch of the rows above at once
CUDA_ONLY = {"model.rope_kernel"}  # Triton's kernels run on a CPU only under its interpreter (tested elsewhere)

# what the H200 leases ran (benchmarks/results/gpu_h200_notes.md): local layers + SDPA, bf16, the distributed optimizer
_GPU = ["model.transformer_impl=local", "model.bf16=true", "parallel.use_distributed_optimizer=true",
        "schedule.global_batch_size=128"]
PRESETS: dict[str, tuple[str | None, list[str]]] = {
    "10m": ("10m_baseline", [*_GPU, "schedule.micro_batch_size=16"]),
    "113m": ("113m_baseline", [*_GPU, "schedule.micro_batch_size=8"]),
    "cpu-tiny": (None, ["preset=tiny", "model.seq_length=64", "model.vocab_size=512", "schedule.global_batch_size=4",
                        "schedule.micro_batch_size=2"]),
}
WARMUP_STEPS = 2


def has_field(config, key: str) -> bool:
    """True when `section.field` is a field of this build's TrainConfig."""
    section, _, name = key.partition(".")
    part = getattr(config, section, None)
    return dataclasses.is_dataclass(part) and name in {f.name for f in dataclasses.fields(part)}


def plan_variants(base, names: list[str], cuda: bool) -> tuple[dict[str, list[str]], dict[str, str]]:
    """(name -> override list, for the variants that run; name -> why not, for the others)."""
    today = [f"{k}={v}" for k, v in TODAY.items() if has_field(base, k)]
    runnable, skipped = {}, {}
    together: dict[str, str] = {}
    for name, switches in VARIANTS.items():
        missing = [k for k in switches if not has_field(base, k)]
        if missing:
            skipped[name] = f"not available in this build ({', '.join(missing)} not in the config)"
        elif not cuda and set(switches) & CUDA_ONLY:
            skipped[name] = f"needs CUDA ({', '.join(sorted(set(switches) & CUDA_ONLY))})"
        else:
            together.update(switches)
            if name in names:
                runnable[name] = today + [f"{k}={v}" for k, v in switches.items()]
    if ALL_TOGETHER in names:
        if len([n for n in VARIANTS if n not in skipped and n != "today"]) >= 2:
            runnable[ALL_TOGETHER] = today + [f"{k}={v}" for k, v in together.items()]
        else:
            skipped[ALL_TOGETHER] = "fewer than two changes available in this build"
    return runnable, {k: v for k, v in skipped.items() if k in names}


class Variant:
    """One configuration's engine, sampler and data, built as the trainer's loop builds them."""

    def __init__(self, name: str, config, total_steps: int) -> None:
        from megatron_ext.positions import build_sampler
        from pretrain.trainer import data
        from pretrain.trainer.engine import Engine

        self.name, self.config, self.steps_done = name, config, 0
        model, schedule = config.model, config.schedule
        self.sampler = build_sampler(config.positions, seed=config.seed, train_seq_len=model.seq_length,
                                     num_layers=model.num_layers, rotary_dim=model.rotary_dim,
                                     rotary_base=model.rotary_base, total_steps=total_steps)
        torch.manual_seed(config.seed)  # every variant starts from the same weights
        self.engine = Engine(model, config.parallel, config.optimizer, total_steps,
                             per_sample_positions=self.sampler.needs_per_sample or config.data.document_masking)
        self.source = data.SyntheticTokens(model.vocab_size, model.seq_length, config.seed,
                                           total_steps * schedule.global_batch_size)
        self.prefetch = None
        if getattr(config.data, "prefetch", False):
            if not hasattr(data, "Prefetcher"):
                raise RuntimeError("data.prefetch is a config field but pretrain.trainer.data has no Prefetcher: "
                                   "update benchmarks/bench_gpu_step.py's Variant to the loop's prefetch path")
            self.prefetch = data.Prefetcher(self.source, 0, total_steps, schedule.global_batch_size, 0, 1,
                                            schedule.micro_batch_size)
        self.micro_batches = schedule.global_batch_size // schedule.micro_batch_size
        self.tokens_per_step = schedule.global_batch_size * model.seq_length
        self.last = None

    def step(self) -> None:
        """One optimizer step, exactly as the loop calls it."""
        from pretrain.trainer.data import step_batches

        s, schedule, seq = self.steps_done, self.config.schedule, self.config.model.seq_length
        batches = self.prefetch.step(s) if self.prefetch else step_batches(
            self.source, s, schedule.global_batch_size, 0, 1, schedule.micro_batch_size)
        self.steps_done += 1  # taken from the prefetcher: a step that then fails is not asked for again
        self.last = self.engine.train_step(batches, self.sampler, s, self.micro_batches, schedule.micro_batch_size,
                                           seq)

    def loss(self) -> float:
        """The last step's loss (a device read: called outside timed blocks)."""
        return float(self.last.loss)

    def close(self) -> None:
        """Stop the prefetch thread, if any."""
        if self.prefetch:
            self.prefetch.close()


def parser() -> argparse.ArgumentParser:
    """The benchmark's arguments."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="cpu-tiny")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds, round-robin over the variants")
    p.add_argument("--steps-per-round", type=int, default=4, help="steps of one variant back to back in a round")
    p.add_argument("--trace-steps", type=int, default=TRACE_STEPS,
                   help="profiled steps per variant for the launch count and the chrome trace")
    p.add_argument("--variants", nargs="+", default=[*VARIANTS, ALL_TOGETHER], metavar="NAME",
                   help=f"among: {', '.join([*VARIANTS, ALL_TOGETHER])}")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="config override for every variant, as for train")
    p.add_argument("--peak-tflops", type=float, help="the device's peak for MFU (default: pretrain.trainer.peak's)")
    p.add_argument("--output", type=Path, help="directory for bench.json, table.txt and the traces "
                   "(default: benchmarks/results/bench_gpu_step_PRESET)")
    return p


def _base_config(args: argparse.Namespace, total_steps: int, scratch: Path):
    from pretrain.trainer.config import CONFIG_DIR, load

    name, overrides = PRESETS[args.preset]
    path = CONFIG_DIR / f"{name}.yaml" if name else None
    fixed = ["data.synthetic=true", f"schedule.train_iters={total_steps}", f"checkpoint.save={scratch}"]
    return path, [*overrides, *fixed, *args.overrides]


def run(args: argparse.Namespace) -> dict:
    """Build every variant, time them round-robin, count syncs and launches, trace; the results as a dict."""
    from megatron_ext.model_config import FLOP_CONVENTION, model_flops_utilization
    from pretrain.trainer import distributed
    from pretrain.trainer.config import load
    from pretrain.trainer.peak import device_peak

    unknown = [n for n in args.variants if n not in VARIANTS and n != ALL_TOGETHER]
    if unknown:
        names = ", ".join([*VARIANTS, ALL_TOGETHER])
        raise ValueError(f"--variants {' '.join(unknown)}: unknown; choose among {names}")
    if args.rounds < 1 or args.steps_per_round < 1 or args.trace_steps < 1:
        raise ValueError("--rounds, --steps-per-round and --trace-steps must be >= 1")
    output = args.output or REPO / "benchmarks" / "results" / f"bench_gpu_step_{args.preset}"
    output.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available()
    device_type = "cuda" if cuda else "cpu"
    total = WARMUP_STEPS + args.rounds * args.steps_per_round + 1 + args.trace_steps
    path, overrides = _base_config(args, total, output / "scratch")
    base = load(path, overrides)
    base.validate(1)
    runnable, skipped = plan_variants(base, args.variants, cuda)
    distributed.initialize(base.parallel, base.seed)
    failed: dict[str, str] = {}
    variants: dict[str, Variant] = {}
    try:
        for name, extra in runnable.items():
            built = _attempt(failed, name, "build", lambda: Variant(name, load(path, [*overrides, *extra]), total))
            if built is not None:
                variants[name] = built
        result = _measure(args, base, variants, runnable, failed, output, cuda, device_type,
                          FLOP_CONVENTION, model_flops_utilization, device_peak)
        return {**result, "skipped": skipped, "failed": failed}
    finally:
        for variant in variants.values():
            variant.close()
        distributed.destroy()


def _attempt(failed: dict[str, str], name: str, stage: str, call):
    """call(), or None with the variant's failure recorded in one line (the other variants still run)."""
    try:
        return call()
    except Exception as error:  # noqa: BLE001 - any failure of one variant is reported, not fatal to the others
        failed[name] = f"{stage}: {type(error).__name__}: {(str(error).splitlines() or [''])[0][:200]}"
        print(f"bench_gpu_step: variant {name!r} failed at {stage}: {failed[name]}", file=sys.stderr, flush=True)
        return None


def _measure(args, base, variants, runnable, failed, output, cuda, device_type, convention, mfu_of, device_peak):
    model, schedule = base.model, base.schedule
    peak = device_peak(args.peak_tflops, model, schedule.micro_batch_size)
    for name, variant in variants.items():
        _attempt(failed, name, "warm-up", lambda: [variant.step() for _ in range(WARMUP_STEPS)])
    seconds = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, variant in variants.items():
            if name not in failed:
                took = _attempt(failed, name, "timed steps", lambda: timed_block(variant, args.steps_per_round))
                seconds[name].append(None if took is None else took / args.steps_per_round)
    rows = {}
    for name, variant in variants.items():
        if name in failed:
            continue
        step_s = statistics.median(seconds[name])
        tokens_per_s = variant.tokens_per_step / step_s
        syncs, sync_how = count_syncs(variant, device_type)
        trace = output / f"trace_{args.preset}_{name.replace(' ', '_')}.json.gz"
        profiled = _attempt(failed, name, "profile", lambda: profile(variant, trace, cuda, args.trace_steps))
        if profiled is None:
            continue
        launches, launch_how = profiled
        rows[name] = {"overrides": runnable[name], "step_s": step_s, "step_s_per_round": seconds[name],
                      "tokens_per_s": tokens_per_s,
                      "mfu": mfu_of(model.flops_per_token(), tokens_per_s, peak.tflops),
                      "mfu_causal_once": mfu_of(model.flops_per_token(causal_attention_once=True), tokens_per_s,
                                                peak.tflops),
                      "host_syncs_per_step": syncs, "host_syncs_counted_by": sync_how,
                      "launches_per_step": launches, "launches_counted": launch_how,
                      "trace": trace.name, "last_loss": variant.loss()}
    device = torch.cuda.get_device_name() if cuda else f"CPU, {torch.get_num_threads()} threads"
    return {"preset": args.preset, "device": device, "torch": torch.__version__, "megatron_core": _megatron_version(),
            "config": PRESETS[args.preset][0] or "defaults", "config_overrides": [*PRESETS[args.preset][1],
                                                                                  *args.overrides],
            "model": {"non_embedding_parameters": model.non_embedding_parameters(),
                      "padded_vocab_size": model.padded_vocab_size(), "seq_length": model.seq_length,
                      "bf16": model.bf16, "transformer_impl": model.transformer_impl},
            "global_batch_size": schedule.global_batch_size, "micro_batch_size": schedule.micro_batch_size,
            "use_distributed_optimizer": base.parallel.use_distributed_optimizer,
            "rounds": args.rounds, "steps_per_round": args.steps_per_round, "warmup_steps": WARMUP_STEPS,
            "trace_steps": args.trace_steps, "peak_tflops": peak.tflops, "peak_source": peak.describe(),
            "flop_convention": convention, "variants": rows,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def _megatron_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("megatron-core")
    except PackageNotFoundError:
        return "unknown (no pip metadata)"


def table(result: dict) -> str:
    """The side-by-side table, with what each column counts."""
    rows = result["variants"]
    base = rows.get("today")
    width = max([len(n) for n in [*rows, *result["skipped"], *result["failed"]]] + [8]) + 2
    lines = [f"bench_gpu_step {result['preset']} on {result['device']} ({result['date']}; torch {result['torch']}, "
             f"megatron-core {result['megatron_core']}): padded vocabulary {result['model']['padded_vocab_size']:,}, "
             f"w = {result['model']['seq_length']}, global batch {result['global_batch_size']} x micro-batch "
             f"{result['micro_batch_size']}, {'bf16' if result['model']['bf16'] else 'fp32'}, "
             f"{result['model']['transformer_impl']} layers, distributed optimizer "
             f"{'on' if result['use_distributed_optimizer'] else 'off'}",
             f"{'variant':<{width}}{'tokens/s':>12}{'vs today':>10}{'s/step':>9}{'MFU':>8}{'MFU causal':>12}"
             f"{'syncs/step':>12}{'launches/step':>15}"]
    for name, row in rows.items():
        ratio = f"{row['tokens_per_s'] / base['tokens_per_s']:.2f}x" if base else "-"
        syncs = "n/a" if row["host_syncs_per_step"] is None else str(row["host_syncs_per_step"])
        lines.append(f"{name:<{width}}{row['tokens_per_s']:>12,.0f}{ratio:>10}{row['step_s']:>9.3f}"
                     f"{100 * row['mfu']:>7.2f}%{100 * row['mfu_causal_once']:>11.2f}%{syncs:>12}"
                     f"{row['launches_per_step']:>15,.0f}")
    for name, why in {**result["skipped"], **{n: f"FAILED at {w}" for n, w in result["failed"].items()}}.items():
        lines.append(f"{name:<{width}}{why}")
    first = next(iter(rows.values()), None)
    if first:
        lines += [f"MFU: {result['flop_convention']}, against {result['peak_tflops']:.4g} TFLOP/s "
                  f"({result['peak_source']}); MFU causal: causal attention counted once",
                  f"syncs: {first['host_syncs_counted_by']}; launches: {first['launches_counted']}, over "
                  f"{result['trace_steps']} steps (the traces: trace_*.json.gz)",
                  f"s/step: median of {result['rounds']} rounds of {result['steps_per_round']} steps back to back, "
                  f"after {result['warmup_steps']} warm-up steps"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run, print the table, write bench.json and table.txt; 1 when a variant failed, 2 (one line) on bad input."""
    args = parser().parse_args(argv)
    try:
        result = run(args)
    except ValueError as error:
        print(f"bench_gpu_step: {error}", file=sys.stderr)
        return 2
    output = args.output or REPO / "benchmarks" / "results" / f"bench_gpu_step_{args.preset}"
    shutil.rmtree(output / "scratch", ignore_errors=True)
    text = table(result)
    print(text)
    (output / "table.txt").write_text(text + "\n")
    (output / "bench.json").write_text(json.dumps(result, indent=1) + "\n")
    return 1 if result["failed"] else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
