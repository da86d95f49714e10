"""Issue 59: the paper's Table 2 row (10.6M, w = 2048, 500M tokens, eval at 16K), baseline and PosAug side by side
on one GPU, in one prepared command (benchmarks/gpu_table2.sh runs it on the device machine).

1. data: the pack (benchmarks/table2_data.py) tokenized here with all cores and checked against the shards built
   where it was packed (or --data-prefix);
2. budget: from a measured rate (--tokens-per-s, both runs together; else gpu_lease's calibration of one run
   alone, taken as the rate of both: it errs low) and the lease's deadline, each run gets the preset's tokens (the
   paper's 500M for gpu-10m) or, when that does not fit, the largest equal budget that does; the report's first
   line says which, and why;
3. train both (gpu_lease's processes: a run still training at this call's deadline saves on SIGTERM and the same
   command, called again while the machine is warm, continues it);
4. evaluate both on the same spans (cliff, exact G at the eval length over GAIN_SPANS spans, in-dist, paired SEs)
   and write report.md beside the paper's row (benchmarks/table2_report.py; `merge` joins seeds).
A deadline that stops the runs short of the plan is said in the first line, never passed over.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gpu_lease  # noqa: E402
import table2_report  # noqa: E402

SAFETY = 0.85  # the share of the measured rate a plan counts on (start-up of two processes, logging, saving)
GAIN_SPANS = 8
MIN_STEPS = 20
EVAL_RESERVE_S = 60  # two evaluations of 16 spans x 16K plus G(16K) over 8 spans (~20 s each measured on an H200)


@dataclasses.dataclass(frozen=True)
class Budget:
    """Each run's steps and tokens, and the sentence that opens the report."""

    steps: int
    tokens: int
    full: bool
    first_line: str


def fit_budget(rate: float, seconds: float, step_tokens: int, target_tokens: int, runs: int = 2,
               min_steps: int = MIN_STEPS) -> Budget:
    """The largest equal budget (at most target_tokens each) that `runs` runs trained side by side at `rate` tokens/s
    (all of them together) finish in `seconds`."""
    target_steps = target_tokens // step_tokens
    steps = min(target_steps, int(rate * max(seconds, 0.0) * SAFETY / runs) // step_tokens)
    tokens = steps * step_tokens
    need = runs * target_steps * step_tokens / (rate * SAFETY)
    measured = f"{rate:,.0f} tokens/s measured for both runs together"
    if steps == target_steps:
        line = (f"Budget: the full {target_tokens:,} tokens per run ({steps} steps), both runs: ~{need:.0f} s "
                f"at {measured}, {seconds:.0f} s available.")
    elif steps < min(min_steps, target_steps):
        line = (f"Nothing trained: only {steps} steps per run fit {seconds:.0f} s at {measured}; "
                f"the full {target_tokens:,} tokens per run need ~{need:.0f} s.")
    else:
        line = (f"Budget SHORT of the full {target_tokens:,} tokens per run: {tokens:,} each ({steps} steps, "
                f"{100 * tokens / target_tokens:.1f} %), the largest equal budget that fits {seconds:.0f} s at "
                f"{measured}; the full budget needs ~{need:.0f} s.")
    return Budget(steps, tokens, steps == target_steps, line)


def make_plan(args: argparse.Namespace, out: Path, preset, prefix: str) -> dict:
    """Rate (given or calibrated), budget, the two runs' configs; the plan (steps 0: nothing fits)."""
    base = ["model.transformer_impl=local", *args.set]
    if args.tokens_per_s:
        rate, start_up, overrides = args.tokens_per_s, gpu_lease.START_UP_S, [*base, *gpu_lease.ATTEMPTS[0]]
    else:
        rate, start_up, overrides = gpu_lease.calibrate(out, preset, prefix, base, args.call_deadline)
    start_up = max(gpu_lease.START_UP_S, 1.3 * start_up)
    seconds = args.deadline - time.time() - args.eval_reserve - start_up
    budget = fit_budget(rate, seconds, preset.global_batch_size * preset.window, preset.train_tokens)
    gpu_lease.log(budget.first_line)
    runs = [f"{m}_s{args.seed}" for m in table2_report.METHODS]
    if budget.steps >= min(MIN_STEPS, preset.train_iters):
        planned = dataclasses.replace(preset, train_tokens=budget.tokens)
        for name in runs:
            gpu_lease.write_config(out, planned, name.rsplit("_s", 1)[0], args.seed, prefix, name, overrides)
    else:
        budget = dataclasses.replace(budget, steps=0)
    return {"preset": args.preset, "seed": args.seed, "data_prefix": prefix, "runs": runs, "steps": budget.steps,
            "train_tokens": budget.tokens, "target_tokens": preset.train_tokens, "rate": rate,
            "start_up": start_up, "deadline": args.deadline, "first_line": budget.first_line}


def data_prefix(args: argparse.Namespace) -> tuple[str, dict]:
    """The data prefix and the pack's description (corpus, unique tokens) for the report."""
    import table2_data

    if args.data_prefix:
        return args.data_prefix, {}
    prefix = table2_data.unpack(Path(args.pack), Path(args.shards), args.workers)
    return str(prefix), json.loads((Path(args.shards) / "pack.json").read_text())


def run(args: argparse.Namespace) -> int:
    """One call: data, plan (first call), train until this call's deadline, evaluate and report when done."""
    import torch
    from pretrain.experiments.presets import PRESETS
    from pretrain.trainer.checkpoint import latest_iteration

    out = Path(args.output or f".table2/{args.preset}_s{args.seed}")
    (out / "logs").mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    gpu_lease.log(f"device {device}, torch {torch.__version__}")
    prefix, data = data_prefix(args)
    from data_prep.manifest import load_manifest

    # the pack's tokenizer sets the vocabulary (the gpu-10m preset's 4,096 was its embedded corpus's)
    preset = dataclasses.replace(PRESETS[args.preset], methods=table2_report.METHODS, inference=(),
                                 gain_spans=GAIN_SPANS, vocab_size=load_manifest(prefix).vocab_size)
    plan_path = out / "plan.json"
    if plan_path.exists():
        plan = json.loads(plan_path.read_text())
        gpu_lease.log(f"continuing {plan_path}: {plan['steps']} steps per run; {plan['first_line']}")
    else:
        plan = make_plan(args, out, preset, prefix)
        plan_path.write_text(json.dumps(plan, indent=1))
    if plan["steps"] == 0:
        return finish(args, out, {"first_line": plan["first_line"]}, report=False)
    preset = dataclasses.replace(preset, train_tokens=plan["train_tokens"])
    runs, steps = plan["runs"], plan["steps"]
    todo = [n for n in runs if latest_iteration(out / "runs" / n) != steps]
    left = sum(steps - (latest_iteration(out / "runs" / n) or 0) for n in todo) * preset.global_batch_size * \
        preset.window / plan["rate"] + (plan["start_up"] if todo else 0)
    end = min(args.call_deadline, plan["deadline"])
    # train only when the rest cannot also be evaluated in this call; else keep the evaluation's reserve
    stop_at = end - gpu_lease.STOP_GRACE_S - (0 if time.time() + left + args.eval_reserve > end else args.eval_reserve)
    codes = gpu_lease.wait_all({n: gpu_lease.train(out / "configs" / f"{n}.yaml", out / "logs" / f"{n}.log",
                                                   stop_at - time.time()) for n in todo})
    reached = {n: latest_iteration(out / "runs" / n) or 0 for n in runs}
    for name, code in codes.items():
        gpu_lease.log(f"train {name}: exit {code} at iteration {reached[name]} of {steps}")
    first_line = plan["first_line"]
    if any(reached[n] != steps for n in runs):
        if plan["deadline"] - time.time() > args.eval_reserve + 2 * gpu_lease.START_UP_S:
            gpu_lease.log("not finished: run the same command again (the machine still warm) to continue")
            return 3
        if not all(reached.values()):
            return finish(args, out, {"first_line": f"Nothing to evaluate: the deadline stopped the runs at "
                                                    f"iterations {reached} of {steps}. {first_line}"}, report=False)
        first_line = (f"SHORT of the plan: the deadline stopped the runs at iterations "
                      f"{', '.join(f'{n} {i}' for n, i in reached.items())} of {steps}; evaluated there. {first_line}")
    records = gpu_lease.evaluate(out, preset, {n: out / "runs" / n for n in runs}, args.seed, prefix)
    results = {"first_line": first_line, "preset": args.preset, "window": preset.window,
               "eval_length": preset.eval_length, "num_spans": preset.num_spans, "gain_spans": preset.gain_spans,
               "train_tokens": plan["train_tokens"], "steps": steps, "target_tokens": plan["target_tokens"],
               "seeds": [args.seed], "reached": reached, "device": device, "date": time.strftime("%Y-%m-%d"),
               "data": data, "records": records}
    return finish(args, out, results, report=True)


def finish(args: argparse.Namespace, out: Path, results: dict, report: bool) -> int:
    """Write (report) or state (no report) the outcome; copy it to --export."""
    if report:
        path = table2_report.write(out, results)
    else:
        path = out / "report.md"
        path.write_text(results["first_line"] + "\n")
    print(path.read_text(), flush=True)
    if args.export:
        Path(args.export).mkdir(parents=True, exist_ok=True)
        for name in ("report.md", "results.json", "plan.json"):
            if (out / name).exists():
                shutil.copy(out / name, Path(args.export) / name)
    return 0 if report else 1


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments and run one call."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="gpu-10m", help="cpu-tiny: the CPU dry run of the same command")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--output", default=None, help="default .table2/PRESET_sSEED (git-ignored)")
    parser.add_argument("--data-prefix", default=None, help="shards already built (skips the pack)")
    parser.add_argument("--pack", default=".gpu_data_table2")
    parser.add_argument("--shards", default=".table2_shards")
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--deadline", type=float, required=True, help="epoch seconds: the lease's end (first call)")
    parser.add_argument("--call-deadline", type=float, required=True, help="epoch seconds: this call's end")
    parser.add_argument("--tokens-per-s", type=float, default=None, help="both runs together, from an earlier lease")
    parser.add_argument("--eval-reserve", type=float, default=EVAL_RESERVE_S)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--export", default=None, help="a folder to copy report.md and results.json to ($OUT)")
    args = parser.parse_args(argv)
    import table2_data

    try:
        return run(args)
    except table2_data.PackError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
