"""Issue 40's GPU item in one short lease: the 10m model at w = 2048 with each method, evaluated at 16K.

`reproduce --preset gpu-10m` trains its runs one after another for the paper's 500M tokens each (~9.3 min per run
on an H200 without Transformer Engine: benchmarks/results/plan_10m_h200.txt). A lease is shorter than that, so this
script fits the comparison into a deadline:

1. calibrate: a few steps of the baseline alone give tokens/s (bf16, local layers, distributed optimizer;
   without the distributed optimizer if that fails, and the log says so);
2. budget: every method gets the same token count, the one that lets all runs, trained side by side on the one
   GPU, end before the deadline less the evaluation's reserve (at most the preset's 500M);
3. train all runs at once (one process each, the same seed: same data order and initial weights);
4. evaluate every finished run on the same 16K-token spans and write reproduce's report.

`--tokens-per-run N` fixes the budget instead (the paper's 500M: more than one call's 10 minutes). The plan is kept
in OUT/plan.json; a run still training at the deadline gets SIGTERM, saves and exits 75, and the same command run
again (on the same warm machine, OUT kept) continues every unfinished run from its checkpoint and evaluates once all
have finished. A budget fitted to one call evaluates even a run the deadline stopped, at the iteration it reached.

Usage (benchmarks/gpu_lease.sh runs it on the device machine):
  python benchmarks/gpu_lease.py --output OUT --data-prefix DATA/shards/corpus --deadline EPOCH_SECONDS
Before the lease, here (the data gpu_lease.sh and the TE battery carry as .gpu_data):
  python benchmarks/gpu_lease.py --prepare-data --output .gpu_data
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

DEFAULT_METHODS = ("posaug", "prope", "irope", "ssmax", "pose")
# What the shipped configs train with, minus Transformer Engine (not on the device machine); then fallbacks.
ATTEMPTS = (("model.bf16=true", "parallel.use_distributed_optimizer=true"),
            ("model.bf16=true", "parallel.use_distributed_optimizer=false"),
            ("model.bf16=false", "parallel.use_distributed_optimizer=false"))
EVAL_RESERVE_S = 110  # six evaluations of 16 spans x 16K tokens, each loading its checkpoint
START_UP_S = 35  # at least: a training process's import, CUDA, compile and data start-up (calibration measures it)
CALIBRATION_STEPS = 8
STOP_GRACE_S = 20  # a run stopped at the deadline saves its checkpoint in this time, or is killed (10m on an H200: ~1 s)


def log(message: str) -> None:
    """One timestamped line on stdout (the lease's log)."""
    print(f"[gpu_lease {time.strftime('%H:%M:%S')}] {message}", flush=True)


def write_config(out: Path, preset, method: str, seed: int, prefix: str, name: str, overrides: list[str]) -> Path:
    """The resolved YAML of one run, as reproduce writes it."""
    from pretrain.experiments.reproduce import train_config
    from pretrain.trainer import config as config_module

    path = out / "configs" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(config_module.dump(train_config(preset, method, seed, prefix, out / "runs" / name, overrides)))
    return path


def train(config: Path, log_path: Path, timeout: float) -> tuple[subprocess.Popen, float]:
    """Start `python -m pretrain train --config` with its output in log_path; (process, its deadline)."""
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    with open(log_path, "a") as handle:  # the child keeps its own copy; "a": a continued run keeps its first log
        proc = subprocess.Popen([sys.executable, "-m", "pretrain", "train", "--config", str(config)],
                                stdout=handle, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    return proc, time.time() + timeout


def wait_all(procs: dict[str, tuple[subprocess.Popen, float]]) -> dict[str, int]:
    """Wait for every process until its deadline; past it, SIGTERM its process group (the trainer saves and exits
    75, as under SLURM), and SIGKILL it STOP_GRACE_S later (rc -9)."""
    import signal

    codes: dict[str, int] = {}
    terminated: dict[str, float] = {}
    while len(codes) < len(procs):
        for name, (proc, deadline) in procs.items():
            if name in codes:
                continue
            if proc.poll() is not None:
                codes[name] = proc.returncode
            elif name in terminated and time.time() > terminated[name] + STOP_GRACE_S:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                codes[name] = -9
            elif name not in terminated and time.time() > deadline:
                os.killpg(proc.pid, signal.SIGTERM)
                terminated[name] = time.time()
        time.sleep(1)
    return codes


def tokens_per_s(log_path: Path) -> float | None:
    """The last `K tok/s` the trainer logged."""
    found = re.findall(r"([0-9.]+)K tok/s", log_path.read_text(errors="replace"))
    return float(found[-1]) * 1e3 if found else None


def calibrate(out: Path, preset, prefix: str, overrides: list[str],
              deadline: float) -> tuple[float, float, list[str]]:
    """(tokens/s of one run alone, its start-up seconds, the overrides that trained): the ATTEMPTS in order."""
    for attempt in ATTEMPTS:
        tried = [*overrides, *attempt, f"schedule.train_iters={CALIBRATION_STEPS}",
                 f"logging.log_interval={CALIBRATION_STEPS // 2}", f"checkpoint.save_interval={CALIBRATION_STEPS}", "optimizer.lr_warmup_iters=1"]
        name = "calibrate_" + "_".join(a.rsplit(".", 1)[1].replace("=", "_") for a in attempt)
        config = write_config(out, preset, "baseline", 1, prefix, name, tried)
        log_path = out / "logs" / f"{name}.log"
        started = time.time()
        code = wait_all({name: train(config, log_path, min(150, deadline - time.time()))})[name]
        rate, elapsed = tokens_per_s(log_path), time.time() - started
        log(f"calibration {' '.join(attempt)}: exit {code} in {elapsed:.0f} s, "
            f"{rate or 0:,.0f} tokens/s")
        if code == 0 and rate:
            start_up = elapsed - CALIBRATION_STEPS * preset.global_batch_size * preset.window / rate
            return rate, start_up, [*overrides, *attempt]
        log("its log's last lines:\n" + "\n".join(log_path.read_text(errors="replace").splitlines()[-25:]))
    raise RuntimeError("the 10m model trained in none of " + str(ATTEMPTS))


def evaluate(out: Path, preset, runs: dict[str, Path], seed: int, prefix: str) -> list[dict]:
    """reproduce's evaluation of each finished run; transformers first, the Megatron model if that fails."""
    from pretrain.evaluation.data import eval_spans, load_stream
    from pretrain.experiments.reproduce import evaluate_run

    spans = eval_spans(load_stream(prefix), preset.num_spans, preset.eval_length)
    records = []
    for name, run_dir in runs.items():
        label = name.rsplit("_s", 1)[0]
        started = time.time()
        record = None
        for backend in (None, "megatron"):  # the lease is one shot: say why a scorer failed, then try the other
            try:
                record = evaluate_run(run_dir, label, seed, preset, spans, backend=backend)
                break
            except Exception:  # noqa: BLE001
                log(f"{label}: the {backend or 'automatic'} scorer failed:\n{traceback.format_exc()}")
        if record is None:
            continue
        (out / "eval").mkdir(exist_ok=True)
        (out / "eval" / f"{name}.json").write_text(json.dumps(record))
        records.append(record)
        cliff = record["lengths"][str(preset.eval_length)]["cliff"]
        log(f"eval {label}: cliff {cliff['cliff']:.3f} (in-dist {cliff['in_dist']:.3f}, beyond w {cliff['ood']:.3f}) "
            f"in {time.time() - started:.0f} s")
    return records


def make_plan(args: argparse.Namespace, out: Path) -> dict | None:
    """Calibrate (or take --tokens-per-s), fix every run's steps, write the runs' configs; None if none fit."""
    from pretrain.experiments.presets import PRESETS
    from pretrain.experiments.reproduce import with_methods

    preset = dataclasses.replace(with_methods(PRESETS[args.preset], args.methods), inference=())
    if args.tokens_per_s:
        rate, start_up = args.tokens_per_s, START_UP_S
        overrides = ["model.transformer_impl=local", *args.set, *ATTEMPTS[0]]
    else:
        rate, start_up, overrides = calibrate(out, preset, args.data_prefix,
                                              ["model.transformer_impl=local", *args.set], args.deadline)
    start_up = max(START_UP_S, 1.3 * start_up)  # all runs start at once: their start-ups share the CPUs

    runs = [f"{method}_s{args.seed}" for method in preset.methods]
    train_seconds = args.deadline - time.time() - args.eval_reserve - start_up
    step_tokens = preset.global_batch_size * preset.window
    most = preset.train_tokens // step_tokens
    if args.tokens_per_run:
        steps = min(most, args.tokens_per_run // step_tokens)
    else:
        steps = min(most, int(rate * train_seconds * 0.85 / len(runs) // step_tokens))
        if steps < min(20, most):
            log(f"only {steps} steps per run fit before the deadline: nothing trained")
            return None
    tokens = steps * step_tokens
    log(f"budget: {len(runs)} runs side by side, {steps} steps = {tokens:,} tokens each "
        f"({100 * tokens / 500e6:.1f} % of the paper's 500M), {train_seconds:.0f} s for training in this call "
        f"after {start_up:.0f} s of start-up at ~{rate:,.0f} tokens/s in all")
    preset = dataclasses.replace(preset, train_tokens=tokens)
    for name in runs:
        write_config(out, preset, name.rsplit("_s", 1)[0], args.seed, args.data_prefix, name, overrides)
    return {"preset": args.preset, "methods": list(args.methods), "seed": args.seed, "data_prefix": args.data_prefix,
            "runs": runs, "steps": steps, "train_tokens": tokens,
            "calls": "several" if args.tokens_per_run else "one"}


def main() -> int:
    """Calibrate, budget, train side by side, evaluate, report."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output", required=True)
    parser.add_argument("--data-prefix", help="required unless --prepare-data")
    parser.add_argument("--deadline", type=float, help="epoch seconds by which the report is written (required "
                                                       "unless --prepare-data)")
    parser.add_argument("--prepare-data", action="store_true",
                        help="here, before a lease: build OUTPUT/data/shards/corpus and its tokenizer (the preset's "
                             "corpus, vocabulary and split, as reproduce does) and exit; carry OUTPUT (.gpu_data)")
    parser.add_argument("--methods", nargs="+", default=list(DEFAULT_METHODS))
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--preset", default="gpu-10m", help="cpu-tiny: a CPU smoke run of this script")
    parser.add_argument("--tokens-per-s", type=float, default=None,
                        help="all runs' tokens/s side by side, measured in an earlier lease: skips the calibration "
                             "and trains with the shipped bf16 + distributed optimizer")
    parser.add_argument("--eval-reserve", type=float, default=EVAL_RESERVE_S, help="seconds kept for evaluation")
    parser.add_argument("--tokens-per-run", type=int, default=None,
                        help="every run's tokens (at most the preset's), over as many calls as it takes")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for every run, e.g. schedule.micro_batch_size=32 (repeatable)")
    args = parser.parse_args()
    if args.prepare_data:
        from pretrain.experiments.presets import PRESETS
        from pretrain.experiments.reproduce import prepare_data

        print(prepare_data(Path(args.output), PRESETS[args.preset], None))
        return 0
    if args.data_prefix is None or args.deadline is None:
        parser.error("--data-prefix and --deadline are required (or --prepare-data, to build the data here)")

    import torch
    from pretrain.experiments.presets import PRESETS
    from pretrain.experiments.reproduce import summarise, with_methods
    from pretrain.experiments.reproduce_report import write_report
    from pretrain.trainer.checkpoint import latest_iteration

    started = time.time()
    out = Path(args.output)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    log(f"device {device}, torch {torch.__version__}, {time.strftime('%Y-%m-%d')}")
    plan_path = out / "plan.json"
    if plan_path.exists():  # an earlier call's runs: continue them with their own configs
        plan = json.loads(plan_path.read_text())
        log(f"continuing {plan_path}: {len(plan['runs'])} runs of {plan['steps']} steps")
    else:
        plan = make_plan(args, out)
        if plan is None:
            return 1
        plan_path.write_text(json.dumps(plan, indent=1))
    preset = dataclasses.replace(with_methods(PRESETS[plan["preset"]], plan["methods"]), inference=(),
                                 train_tokens=plan["train_tokens"])
    steps, runs = plan["steps"], plan["runs"]
    stop_at = args.deadline - args.eval_reserve - STOP_GRACE_S
    todo = [name for name in runs if latest_iteration(out / "runs" / name) != steps]
    codes = wait_all({name: train(out / "configs" / f"{name}.yaml", out / "logs" / f"{name}.log",
                                  stop_at - time.time()) for name in todo})
    reached = {name: latest_iteration(out / "runs" / name) for name in runs}
    for name, code in codes.items():
        rate = tokens_per_s(out / "logs" / f"{name}.log")
        log(f"train {name}: exit {code} at iteration {reached[name]} of {steps}, last {rate or 0:,.0f} tokens/s")
    finished = {name: out / "runs" / name for name in runs if reached[name] == steps}
    if len(finished) < len(runs) and plan["calls"] == "several":
        log(f"{len(finished)} of {len(runs)} runs finished: run the same command again to continue the others")
        return 3
    for name in runs:
        if name not in finished and reached[name]:  # unequal budgets: said, not hidden
            log(f"{name} was stopped by the deadline at iteration {reached[name]} of {steps}; it is evaluated there")
            finished[name] = out / "runs" / name
    if "baseline_s%d" % plan["seed"] not in finished:
        log("the baseline did not finish: no report")
        return 1
    records = evaluate(out, preset, finished, plan["seed"], plan["data_prefix"])
    preset = dataclasses.replace(preset, methods=tuple(n.rsplit("_s", 1)[0] for n in finished))
    report = write_report(out, f"{plan['preset']} ({device}, {preset.train_tokens:,} tokens per run)", preset,
                          summarise(records, preset), records, [plan["seed"]], time.time() - started)
    log(f"report: {report}")
    print(report.read_text(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
