"""Find a task budget that passes the learnability gate: train the RoPE baseline once, score seen lengths per checkpoint.

    .venv/bin/python benchmarks/calibrate_task_budget.py --task addition --lengths 2 4 --iters 2000 --lr 2e-3 \
        --warmup 100 --checkpoints 4

One training run (the suite's own run_config for `baseline`, with the overrides given), saving
`--checkpoints` evenly spaced checkpoints of one cosine schedule, then exact match on every seen
length at each checkpoint. A mid-schedule checkpoint has not decayed its learning rate, so a run
whose whole schedule is that long does at least as well as a rule (not guaranteed). The numbers behind
the cpu-long preset (pretrain/tasks/presets.py) are recorded in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pretrain.tasks.generators import TASKS, VOCAB_SIZE  # noqa: E402
from pretrain.tasks.presets import PRESETS, SuitePreset  # noqa: E402
from pretrain.tasks.verdict import GATE  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    """Train, score each checkpoint on seen lengths, print one JSON line; exit 2 on bad input."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", required=True)
    parser.add_argument("--lengths", type=int, nargs=2, required=True, metavar=("A", "N"))
    parser.add_argument("--iters", type=int, default=1000)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--warmup", type=int, default=None, help="warm-up steps (default: the suite's iters // 20)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--checkpoints", type=int, default=4)
    parser.add_argument("--count", type=int, default=100, help="held-out examples per seen length")
    parser.add_argument("--output", default="calibrate_out")
    args = parser.parse_args(argv)
    if args.task not in TASKS:
        print(f"error: --task {args.task!r} is not a task; choose one of {', '.join(TASKS)}", file=sys.stderr)
        return 2
    if not TASKS[args.task].min_length <= args.lengths[0] <= args.lengths[1] or args.iters % args.checkpoints:
        print(f"error: need {TASKS[args.task].min_length} <= A <= N and --iters divisible by --checkpoints",
              file=sys.stderr)
        return 2

    import torch

    from megatron_ext.positions import build_sampler
    from pretrain.tasks.evaluate import accuracy_by_length
    from pretrain.tasks.suite import run_config
    from pretrain.trainer import config as config_module
    from pretrain.trainer.inference_model import load_for_inference

    lo, hi = args.lengths
    preset = SuitePreset(tasks={args.task: (lo, hi)}, model=PRESETS["cpu-long"].model, train_iters=args.iters,
                         global_batch_size=args.batch, lr=args.lr, eval_count=args.count)
    out = Path(args.output) / f"{args.task}_{lo}-{hi}_{args.iters}_lr{args.lr:g}"
    out.mkdir(parents=True, exist_ok=True)
    raw = run_config(preset, args.task, "baseline", 42, out)
    raw["checkpoint"].update(save_interval=args.iters // args.checkpoints, keep_last=args.checkpoints)
    if args.warmup is not None:
        raw["optimizer"]["lr_warmup_iters"] = args.warmup
    (out / "config.yaml").write_text(config_module.dump(config_module.from_dict(raw)))
    started = time.time()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with (out / "train.log").open("w") as log:
        code = subprocess.run([sys.executable, "-m", "pretrain", "train", "--config", str(out / "config.yaml")],
                              stdout=log, stderr=subprocess.STDOUT, env=env).returncode
    if code:
        print(f"error: training failed (exit {code}); see {out / 'train.log'}", file=sys.stderr)
        return 1
    train_wall = time.time() - started
    torch.set_num_threads(1)
    seen = {}
    for checkpoint in sorted(out.glob("iter_*")):
        model, config = load_for_inference(checkpoint)
        sampler = build_sampler(config.positions, seed=42, train_seq_len=config.model.seq_length,
                                num_layers=config.model.num_layers, rotary_dim=config.model.rotary_dim,
                                rotary_base=config.model.rotary_base, total_steps=args.iters)
        results = accuracy_by_length(lambda x, p: model(x, p, None)[..., :VOCAB_SIZE], args.task,
                                     range(lo, hi + 1), args.count, 10_042, sampler.evaluation, (lo, hi))
        accuracy = [r.accuracy for r in results]
        seen[int(checkpoint.name.split("_")[1])] = {"mean": sum(accuracy) / len(accuracy), "per_length": accuracy}
    print(json.dumps({"task": args.task, "lengths": [lo, hi], "iters": args.iters, "lr": args.lr,
                      "train_wall_s": round(train_wall), "load": os.getloadavg()[0], "gate": GATE, "seen": seen}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
