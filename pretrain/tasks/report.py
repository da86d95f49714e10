"""The task suite's report: accuracy-vs-length plots, seen / unseen tables (± binomial SE), results.json."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only
import matplotlib.pyplot as plt  # noqa: E402

# What the papers report, for the text under the tables (their setups differ from ours: see there).
PAPER_NUMBERS = """\
- **Index warping, Table A** (sequence accuracy averaged over test lengths 2..5M, train U(2, M), M = 20 for
  copy/reverse, 8 for sort/summation): copy — RoPE 19.2, RoPE+PI 23.5, ALiBi 27.9, RPE (L = 3M) 26.8,
  warp (sqrt) 43.2; reverse — 20.4, 19.3, 22.4, 39.3, 39.8; sort — 18.8, 21.5, 33.6, 43.0, 53.7;
  summation — 27.9, 27.5, 33.0, 32.2 (RPE 10M), warp 29.5.
- **RFS, Table 1 / Fig. 2–3, App. C.3**: RoPE + RFS keeps 83.7 % exact match on unseen copy lengths 21–40
  (trained ≤ 20, 12 layers, 40k steps); without RFS ("simple extension") copy, copy2, reverse and sort show
  nearly no length generalisation; with sinusoidal PE, NoPE is near 20 % at 1.5× the training length while
  RFS keeps ~80 % at 2×; RFS on ALiBi gains less than on RoPE and trails NoPE on copy2 and reverse.
- **Randomized PE, Table 1** (per-token accuracy, chance 50 %, max over 10 seeds × 3 learning rates, 2M
  steps, train ≤ 40, test 41–500): RoPE → randomized RoPE: reverse 51.9 → 69.9, duplicate 50.9 → 68.9,
  missing duplicate 56.5 → 88.7; ALiBi 62.3 / 51.3 / 54.3; no PE 52.8 / 52.8 / 52.5.
  Not comparable in scale: per-token accuracy, not exact match."""


def _cell(entry: dict | None) -> str:
    if entry is None:
        return "—"
    return f"{100 * entry['accuracy']:.1f} ± {100 * entry['se']:.1f}"


def aggregate(records: list[dict]) -> dict[str, dict[str, dict]]:
    """task → method → per-length accuracy (mean over seeds) and seen/unseen mean ± binomial SE."""
    grouped: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for record in records:
        grouped[(record["task"], record["method"])].append(record)
    out: dict[str, dict[str, dict]] = defaultdict(dict)
    for (task, method), group in grouped.items():
        lengths = [r["length"] for r in group[0]["lengths"]]
        accuracy = [sum(r["lengths"][i]["accuracy"] for r in group) / len(group) for i in range(len(lengths))]
        summary = {}
        for part in ("seen", "unseen"):
            parts = [r["summary"][part] for r in group]
            if parts[0] is None:
                summary[part] = None
                continue
            # independent seeds: SE of their mean is sqrt(sum se^2) / n
            summary[part] = {"accuracy": sum(p["accuracy"] for p in parts) / len(parts),
                             "se": math.sqrt(sum(p["se"] ** 2 for p in parts)) / len(parts)}
        out[task][method] = {"lengths": lengths, "accuracy": accuracy, "train_lengths": group[0]["train_lengths"],
                             "seeds": [r["seed"] for r in group], **summary}
    return out


def plot_task(task: str, rows: dict[str, dict], path: Path) -> Path:
    """Exact match vs length, one line per method, training lengths shaded (RFS Fig. 3 / warping Fig. 5)."""
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    lo, hi = next(iter(rows.values()))["train_lengths"]
    ax.axvspan(lo - 0.5, hi + 0.5, color="0.85", label="training lengths")
    for method, row in rows.items():
        ax.plot(row["lengths"], row["accuracy"], marker=".", linewidth=1.2, label=method)
    ax.set(title=task, xlabel="input length", ylabel="exact-match accuracy", ylim=(-0.02, 1.02))
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def tables(summary: dict[str, dict[str, dict]], methods: list[str]) -> str:
    """Two Ruoss-Table-1-shaped tables (tasks × methods): unseen and seen mean exact match, % ± SE."""
    text = []
    for part, title in (("unseen", "Unseen lengths (N+1 … 4N)"), ("seen", "Seen lengths (training range)")):
        header = "| Task | " + " | ".join(methods) + " |"
        lines = [f"**{title}**: mean exact match over lengths, % ± binomial SE", "", header,
                 "|" + "---|" * (len(methods) + 1)]
        for task, rows in summary.items():
            lines.append(f"| {task} | " + " | ".join(_cell(rows.get(m, {}).get(part)) for m in methods) + " |")
        text.append("\n".join(lines))
    return "\n\n".join(text)


def runtime_text(timing: dict) -> str:
    """Wall, CPU and load of the run, and the quiet-machine wall time estimated from CPU time."""
    cpu = timing["train_cpu_s"] + timing["eval_cpu_s"]
    cores = timing.get("cores") or 1
    untimed = timing["runs"] - timing["train_runs_timed"]
    return (f"Runtime: {timing['wall_s'] / 60:.1f} min wall with {timing['jobs']} runs side by side (load average "
            f"{timing['load_start']} at the start, {timing['load_end']} at the end: other jobs on the machine stretch "
            f"wall time, not CPU time); CPU time {timing['train_cpu_s'] / 60:.1f} min training + "
            f"{timing['eval_cpu_s'] / 60:.1f} min evaluation = {cpu / 60:.1f} min; **estimated** wall time on a quiet "
            f"{cores}-core machine ≈ CPU / {cores} = {cpu / cores / 60:.1f} min (an estimate, not a measurement)"
            + (f"; {untimed} run(s) trained by an earlier invocation without timing are not counted" if untimed else "")
            + ".")


DEVIATIONS = """- Models are 3-layer, d = 128 decoders trained for minutes on CPU; the papers train 6–12 layers for
  10k–2M steps. Compare directions, not magnitudes."""


def write_report(out: Path, preset_name: str, preset, records: list[dict], seeds: list[int],
                 timing: dict) -> Path:
    """report.md, results.json and one plot per task under `out`."""
    from pretrain.tasks.compare import baseline_findings, nope_findings, paper_comparison, reach_table

    summary = aggregate(records)
    methods = [m for m in preset.methods if any(m in rows for rows in summary.values())]
    plots = [plot_task(task, {m: rows[m] for m in methods if m in rows}, out / f"accuracy_{task}.png")
             for task, rows in summary.items()]
    ranges = ", ".join(f"{t} U{{{a}..{n}}}" for t, (a, n) in preset.tasks.items())
    papers = paper_comparison(summary, preset.eval_count)
    report = out / "report.md"
    report.write_text("\n\n".join([
        f"# Length generalisation on algorithmic tasks ({preset_name})",
        f"Training lengths {ranges}; evaluation at every length up to {preset.eval_factor}N, "
        f"{preset.eval_count} held-out examples per length, greedy decoding, exact match of answer + <eos>. "
        f"{preset.train_iters} steps × {preset.global_batch_size} examples per method, seeds {seeds}."
        + (" One seed: ± covers the sampling of held-out examples only, not training-seed variance (the papers "
           "report large seed spread; Ruoss et al. take the best of 30 runs)." if len(seeds) == 1 else
           f" ± combines the {len(seeds)} seeds' binomial SEs; it does not estimate seed-to-seed variance."),
        runtime_text(timing),
        tables(summary, methods),
        reach_table(summary, methods),
        "\n".join(f"![{p.stem}]({p.name})" for p in plots),
        "## Against the RoPE baseline (computed from the tables; Δ beyond 2 SE counts)\n\n"
        + "\n".join(baseline_findings(summary, methods)),
        "## Against NoPE (does a RoPE position augmentation beat having no positions at all?)\n\n"
        + ("\n".join(nope_findings(summary, methods)) or "NoPE was not in this run."),
        "## Against the papers (computed: direction of each published difference vs ours)\n\n"
        + ("\n".join(papers) if papers else "No published pair among this run's tasks and methods.")
        + "\n\nThe papers' numbers in full:\n\n" + PAPER_NUMBERS,
        "## Deviations from the papers\n\n" + DEVIATIONS,
    ]) + "\n")
    (out / "results.json").write_text(json.dumps(
        {"preset": preset_name, "seeds": seeds, "timing": timing, "methods": methods,
         "train_lengths": {t: list(r) for t, r in preset.tasks.items()}, "summary": summary, "records": records},
        indent=1))
    return report
