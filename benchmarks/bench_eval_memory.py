"""Evaluation peak memory at 16K vs 4K tokens, HF and Megatron scorers (both SDPA: linear in L).

What runs: a 'cpu-small' model (d 128, 4 layers, 4 heads, vocab 4096; randomly initialised,
since memory does not depend on the weights) is saved once as a Megatron checkpoint through
the trainer's `Engine` + `pretrain.trainer.checkpoint.save`, then every (backend, length) case loads
it with `load_scorer(checkpoint, backend=...)` -- for `hf` that is `megatron_to_llama` +
`HFScorer` (SDPA `is_causal`, LM head in 1024-position chunks), exactly what
`python -m pretrain.evaluation` uses -- and scores ONE span of L tokens with
`per_position_loss` (batch 1).

How memory is measured: each case runs in its own fresh subprocess (so no allocator cache or
earlier peak is shared). After loading the scorer and a short warm-up pass (128 tokens, so
lazy one-off allocations are not counted), the child resets the kernel's resident-set
high-water mark (`echo 5 > /proc/self/clear_refs`, Linux >= 4.0), records its current RSS,
runs the L-token evaluation, and reads the high-water mark again (VmHWM in /proc/self/status).
"peak" is that high-water mark minus the RSS before the evaluation: the extra memory the
evaluation needed at its worst moment. CPU tensors live in process memory and are written
when produced, so every tensor allocation (activations, attention scores, logits chunks) is
in RSS at its peak; allocator slack is included too, which is the honest number for "does it
fit". The children run with a fixed glibc mmap threshold (MALLOC_MMAP_THRESHOLD_=64 KiB), so every
sizeable tensor is its own mapping, unmapped when freed: RSS then follows live tensor bytes rather
than heap slack (with glibc's default dynamic threshold the same run read 57/141/306/238 MiB at
4K/8K/16K/32K; with the fixed one 54/56/102/204 MiB). The hf peak has a floor of ~50 MiB at any L:
the chunked LM head ([1024, 4096] logits + log-softmax); above ~8K the forward's activations
(~6 KiB per token for this model) dominate and double with L. Where clear_refs is unavailable the child falls back to
ru_maxrss (which then includes the model load).

The megatron backend's local layers use SDPA core attention (model.core_attention=sdpa, the
default) and no longer materialise [heads, L, L] scores; with model.core_attention=megatron they
do. A quadratic case (16K with Megatron's unfused attention: ~4 GiB per score tensor, a few alive
at once) runs only when the 4K measurement scaled by 16 fits in 60% of MemAvailable and its time,
scaled the same way, fits --quadratic-time-budget; else it is skipped with the reason printed
(it then tries half that length, so the quadratic growth still shows).

    .venv/bin/python benchmarks/bench_eval_memory.py [--lengths 4096 16384] [--backends hf megatron]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PRESET, TRAIN_WINDOW, SEED = "cpu-small", 64, 1234
MMAP_THRESHOLD = 64 * 1024  # bytes; see run_child
HEADROOM = 0.6  # fraction of MemAvailable a quadratic case may be predicted to use


def _status_kib(field: str) -> int:
    match = re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.MULTILINE)
    return int(match.group(1)) if match else -1


def _mem_available_bytes() -> int:
    match = re.search(r"^MemAvailable:\s+(\d+) kB", Path("/proc/meminfo").read_text(), re.MULTILINE)
    return int(match.group(1)) * 1024 if match else 0


def _quiet() -> None:
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)


def make_checkpoint(run_dir: str) -> None:
    """Child: save a randomly initialised cpu-small model as a Megatron checkpoint (no training)."""
    _quiet()
    import torch

    from megatron_ext.model import ParallelConfig
    from pretrain.trainer import checkpoint, distributed
    from pretrain.trainer import config as config_module
    from pretrain.trainer.config import OptimizerSettings
    from pretrain.trainer.engine import Engine

    torch.set_num_threads(1)
    distributed.initialize(ParallelConfig(), seed=SEED)
    train_config = config_module.from_dict({
        "name": "bench-eval-memory", "seed": SEED, "preset": PRESET,
        "model": {"seq_length": TRAIN_WINDOW}, "data": {"synthetic": True},
        "schedule": {"micro_batch_size": 1, "global_batch_size": 1, "train_iters": 1}})
    engine = Engine(train_config.model, ParallelConfig(), OptimizerSettings(), 1)
    checkpoint.save(run_dir, 1, engine, {"config": config_module.to_dict(train_config)}, keep_last=1)
    distributed.destroy()


def measure(run_dir: str, backend: str, length: int, threads: int) -> dict:
    """Child: peak extra memory of scoring one `length`-token span through load_scorer(backend)."""
    _quiet()
    import resource

    import torch

    from pretrain.evaluation import load_scorer, per_position_loss

    torch.set_num_threads(threads)
    scorer = load_scorer(run_dir, backend=backend)
    generator = torch.Generator().manual_seed(0)
    span = torch.randint(0, scorer.vocab_size, (1, length), generator=generator)
    per_position_loss(scorer, span[:, :128], batch_size=1)  # warm-up: one-off allocations
    try:
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
        method = "VmHWM after clear_refs"
    except OSError:
        method = "ru_maxrss (includes model load)"
    before = _status_kib("VmRSS")
    maxrss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    losses = per_position_loss(scorer, span, batch_size=1)
    seconds = time.perf_counter() - start
    if method.startswith("VmHWM"):
        peak_kib = _status_kib("VmHWM") - before
    else:
        peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - min(before, maxrss_before)
    return {"backend": backend, "length": length, "peak_bytes": peak_kib * 1024, "rss_before_bytes": before * 1024,
            "seconds": seconds, "mean_loss": float(losses.mean()), "method": method}


def run_child(args: list[str], timeout: float) -> dict:
    # A fixed glibc mmap threshold (setting it turns off glibc's dynamic threshold): every block of
    # 64 KiB or more -- every sizeable tensor -- is its own mapping, returned to the kernel on free,
    # so RSS follows the live tensor bytes instead of whatever the heap happened to keep.
    env = dict(os.environ, PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1",
               MALLOC_MMAP_THRESHOLD_=str(MMAP_THRESHOLD))
    proc = subprocess.run([sys.executable, __file__, *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({proc.returncode}):\n"
                           f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    records = [line[len("RESULT "):] for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    return json.loads(records[-1]) if records else {}


def mib(n: float) -> str:
    return f"{n / 2**20:9.1f} MiB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--backends", nargs="+", default=["hf", "megatron"], choices=["hf", "megatron"])
    parser.add_argument("--threads", type=int, default=2, help="torch threads in each measuring child")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per child process")
    parser.add_argument("--quadratic-time-budget", type=float, default=300,
                        help="skip a megatron case whose time, predicted quadratically from the shortest, exceeds this")
    parser.add_argument("--max-ratio", type=float, default=5.0,
                        help="fail (exit 1) when the hf peak ratio exceeds this bound times (L_max/L_min)/4")
    # internal: child modes
    parser.add_argument("--make-checkpoint", metavar="DIR", help=argparse.SUPPRESS)
    parser.add_argument("--measure", nargs=3, metavar=("DIR", "BACKEND", "LENGTH"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.make_checkpoint:
        make_checkpoint(args.make_checkpoint)
        print("RESULT {}")
        return 0
    if args.measure:
        run_dir, backend, length = args.measure
        print("RESULT " + json.dumps(measure(run_dir, backend, int(length), args.threads)), flush=True)
        return 0

    lengths = sorted(set(args.lengths))
    if len(lengths) < 2:
        parser.error("--lengths needs at least two lengths to form a ratio")
    print(f"model: preset {PRESET} (random init), one span per length, batch 1, {args.threads} torch threads; "
          "peak = VmHWM - RSS before the evaluation, each case in a fresh process")
    status = 0
    with tempfile.TemporaryDirectory(prefix="bench_eval_memory_") as tmp:
        run_dir = str(Path(tmp) / "run")
        run_child(["--make-checkpoint", run_dir], args.timeout)
        for backend in args.backends:
            results: dict[int, dict] = {}
            queue = list(lengths)
            while queue:
                length = queue.pop(0)
                if backend == "megatron" and results:
                    smallest = min(results)
                    predicted = results[smallest]["peak_bytes"] * (length / smallest) ** 2
                    available = _mem_available_bytes()
                    seconds = results[smallest]["seconds"] * (length / smallest) ** 2
                    reason = None
                    if predicted > HEADROOM * available:
                        reason = (f"predicted peak {mib(predicted).strip()} (L={smallest} peak x "
                                  f"{(length / smallest) ** 2:.0f}, quadratic) exceeds {HEADROOM:.0%} of "
                                  f"MemAvailable ({mib(available).strip()})")
                    elif seconds > args.quadratic_time_budget:
                        reason = (f"predicted time {seconds:.0f} s (L={smallest} time x "
                                  f"{(length / smallest) ** 2:.0f}) "
                                  f"exceeds --quadratic-time-budget {args.quadratic_time_budget:.0f} s; predicted "
                                  f"peak {mib(predicted).strip()} would fit")
                    if reason:
                        print(f"{backend:>8}  L={length:>6}  skipped: {reason}")
                        if not queue and length // 2 > smallest:
                            queue.append(length // 2)  # the largest length that may fit, for a ratio
                        continue
                record = run_child(["--measure", run_dir, backend, str(length), "--threads", str(args.threads)],
                                   args.timeout)
                results[length] = record
                print(f"{backend:>8}  L={length:>6}  peak {mib(record['peak_bytes'])}  "
                      f"(rss before {mib(record['rss_before_bytes']).strip()}, {record['seconds']:.1f} s, "
                      f"mean loss {record['mean_loss']:.3f}, {record['method']})", flush=True)
            if len(results) >= 2:
                lo, hi = min(results), max(results)
                ratio = results[hi]["peak_bytes"] / max(results[lo]["peak_bytes"], 1)
                length_ratio = hi / lo
                line = f"{backend:>8}  ratio L={hi}/L={lo}: {ratio:.2f}x for {length_ratio:.0f}x the length"
                if backend == "hf":
                    bound = args.max_ratio * length_ratio / 4
                    ok = ratio <= bound
                    line += f"  ({'OK' if ok else 'FAIL'}: linear needs <= {bound:.1f})"
                    status |= 0 if ok else 1
                print(line, flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
