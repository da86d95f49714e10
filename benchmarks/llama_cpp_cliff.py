"""The cliff of trained runs through llama.cpp: each run exported with `export-gguf` (F32, checked against
transformers), its per-position loss over the same spans computed in llama.cpp (llama-cpp-python) and by `eval run`.

    .venv/bin/python benchmarks/llama_cpp_cliff.py RUN [RUN ...] --data PREFIX --length L --num-spans N --output OUT

Needs `make test-llama-cpp`'s install (llama-cpp-python built from source, and `make llama-cpp-converter`). Prints one
row per run (eval run's cliff, in-distribution and beyond-the-window loss, llama.cpp's, the largest difference of the
mean per-position curve) and writes OUT/table.txt and OUT/results.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def parser() -> argparse.ArgumentParser:
    """The command line above."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="trained run directories (checkpoint.save)")
    p.add_argument("--data", required=True, help="data_prep prefix whose validation split is evaluated")
    p.add_argument("--length", type=int, required=True, help="span length in tokens (e.g. 8 windows)")
    p.add_argument("--num-spans", type=int, default=16)
    p.add_argument("--llama-cpp", default=os.environ.get("LLAMA_CPP_DIR"), help="llama.cpp tree (its converter)")
    p.add_argument("--output", type=Path, required=True)
    return p


def measure(run: Path, args: argparse.Namespace) -> dict:
    """eval run's cliff and curve, and llama.cpp's over the same spans, for one run."""
    import torch

    from pretrain.evaluation.cli import eval_cli
    from pretrain.evaluation.data import eval_spans, load_stream
    from pretrain.evaluation.metrics import cliff
    from pretrain.hf.gguf_check import llama_cpp_model, llama_cpp_token_losses
    from pretrain.hf.gguf_export import export_gguf

    out = args.output / run.name
    if eval_cli(["run", str(run), "--data", args.data, "--lengths", str(args.length), "--num-spans",
                 str(args.num_spans), "--output", str(out / "eval"), "--no-progress"]) != 0:
        raise SystemExit(f"llama_cpp_cliff: eval run failed on {run}")
    record = json.loads(next((out / "eval").glob("*.json")).read_text())
    ours = record["lengths"][str(args.length)]
    exported = export_gguf(run, out / "gguf", llama_cpp=args.llama_cpp, overwrite=True)
    llm = llama_cpp_model(exported["gguf"], args.length)
    try:
        losses = llama_cpp_token_losses(llm, eval_spans(load_stream(args.data), args.num_spans, args.length))
    finally:
        llm.close()
    window = int(ours["cliff"]["window"])
    theirs = cliff(losses, window, in_start=ours["cliff"]["in_start"])
    curve_diff = (losses.double().mean(0) - torch.tensor(ours["curve"], dtype=torch.float64)).abs().max().item()
    return {"run": run.name, "window": window, "eval_run": {k: ours["cliff"][k] for k in ("cliff", "in_dist", "ood")},
            "llama_cpp": {k: float(theirs[k]) for k in ("cliff", "in_dist", "ood")},
            "max_curve_diff": curve_diff, "gguf_check": exported["check"]}


def table(rows: list[dict], args: argparse.Namespace) -> str:
    """The rows as fixed-width text."""
    lines = [f"llama_cpp_cliff: {args.num_spans} spans of {args.length} tokens from {args.data} "
             f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
             f"{'run':<24}{'w':>5}  {'cliff: eval run':>16}{'llama.cpp':>11}  {'in-dist':>9}{'llama.cpp':>11}  "
             f"{'OOD':>8}{'llama.cpp':>11}  {'max |Δ curve|':>14}"]
    for r in rows:
        ours, theirs = r["eval_run"], r["llama_cpp"]
        lines.append(f"{r['run']:<24}{r['window']:>5}  {ours['cliff']:>16.4f}{theirs['cliff']:>11.4f}  "
                     f"{ours['in_dist']:>9.4f}{theirs['in_dist']:>11.4f}  {ours['ood']:>8.4f}{theirs['ood']:>11.4f}  "
                     f"{r['max_curve_diff']:>14.2e}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Measure every run, print and write the table; 2 (one line) on bad input."""
    args = parser().parse_args(argv)
    missing = [str(run) for run in args.runs if not run.is_dir()]
    if missing:
        print(f"llama_cpp_cliff: no run directory {', '.join(missing)}", file=sys.stderr)
        return 2
    args.output.mkdir(parents=True, exist_ok=True)
    rows = [measure(run, args) for run in args.runs]
    text = table(rows, args)
    print(text)
    (args.output / "table.txt").write_text(text + "\n")
    (args.output / "results.json").write_text(json.dumps(rows, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
