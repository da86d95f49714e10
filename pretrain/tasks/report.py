"""The task suite's report: accuracy-vs-length plots, seen / unseen tables (± binomial SE), results.json."""

from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only
import matplotlib.pyplot as plt  # noqa: E402

from pretrain.trainer.run_pool import machines_text  # noqa: E402

from .verdict import GATE, METRICS, aggregate, best, gate, ranking  # noqa: E402

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


def _cell(entry: dict | None, metric: str = "accuracy", bold: bool = False) -> str:
    """mean ± seed sd (typical per-seed binomial SE), in %; one seed: mean ± binomial SE."""
    if entry is None or entry.get(metric) is None:
        return "—"
    se_key, sd_key = ("se", "sd") if metric == "accuracy" else ("token_se", "token_sd")
    seeds = entry["per_seed"]
    per_seed_se = math.sqrt(sum(p[se_key] ** 2 for p in seeds) / len(seeds))
    text = (f"{100 * entry[metric]:.1f} ± {100 * entry[sd_key]:.1f} ({100 * per_seed_se:.1f})" if len(seeds) > 1
            else f"{100 * entry[metric]:.1f} ± {100 * per_seed_se:.1f}")
    return f"**{text}**" if bold else text


def plot_task(task: str, rows: dict[str, dict], path: Path) -> Path:
    """Exact match and per-token accuracy vs length, one line per method (mean over seeds, ± sd band),
    training lengths shaded and the longest one marked (RFS Fig. 2 / warping Fig. 5)."""
    panels = [("accuracy", "exact match")] + ([("token_accuracy", "per-token accuracy")]
                                              if all("token_accuracy" in r for r in rows.values()) else [])
    fig, axes = plt.subplots(1, len(panels), figsize=(6.4 * len(panels), 4.0), squeeze=False)
    lo, hi = next(iter(rows.values()))["train_lengths"]
    for ax, (key, label) in zip(axes[0], panels):
        ax.axvspan(lo - 0.5, hi + 0.5, color="0.88", label="training lengths")
        ax.axvline(hi, color="0.3", linestyle="--", linewidth=0.8, label=f"training max N = {hi}")
        for method, row in rows.items():
            line, = ax.plot(row["lengths"], row[key], marker=".", linewidth=1.2, label=method)
            if key == "accuracy" and len(row["seeds"]) > 1:
                low = [a - s for a, s in zip(row["accuracy"], row["accuracy_sd"])]
                high = [a + s for a, s in zip(row["accuracy"], row["accuracy_sd"])]
                ax.fill_between(row["lengths"], low, high, color=line.get_color(), alpha=0.12, linewidth=0)
        ax.set(title=f"{task}: {label}", xlabel="input length n", ylabel=label, ylim=(-0.02, 1.02))
    axes[0][0].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def gate_table(summary: dict[str, dict[str, dict]]) -> str:
    """Per task: the RoPE baseline's seen exact match per seed and whether the task gets a verdict."""
    lines = [f"**Learnability gate**: a task gets a length-generalisation verdict only if the RoPE baseline "
             f"reaches ≥ {100 * GATE:.0f} % exact match on seen lengths (mean over seeds)", "",
             "| Task | training N | RoPE seen, per seed | mean | verdict |", "|---|---|---|---|---|"]
    for task, entry in gate(summary).items():
        n = next(iter(summary[task].values()))["train_lengths"][1]
        per_seed = ", ".join(f"{100 * a:.1f}" for a in entry["per_seed"]) or "—"
        mean = f"{100 * entry['seen']:.1f}" if entry["seen"] is not None else "—"
        lines.append(f"| {task} | {n} | {per_seed} | {mean} | "
                     + ("learned" if entry["passed"] else "**not learned — no length-generalisation verdict**") + " |")
    return "\n".join(lines)


def tables(summary: dict[str, dict[str, dict]], methods: list[str]) -> str:
    """Tasks × methods tables: unseen exact match (RFS / warping), unseen per-token accuracy (Ruoss), seen."""
    passed = gate(summary)
    text = []
    for part, metric, title in (
            ("unseen", "accuracy", "Unseen lengths (N+1 … 4N), exact match (RFS Fig. 2, warping Fig. 5)"),
            ("unseen", "token_accuracy", "Unseen lengths (N+1 … 4N), per-token accuracy (Ruoss et al. Table 1)"),
            ("seen", "accuracy", "Seen lengths (training range), exact match")):
        lines = [f"**{title}**: mean over lengths, % — mean ± seed sd (typical per-seed binomial SE); one seed: "
                 "± binomial SE. Bold: the row's best, only where its lead over the runner-up exceeds both seed sds "
                 "and 2 SE; none in rows without a verdict.", "",
                 "| Task | " + " | ".join(methods) + " |", "|" + "---|" * (len(methods) + 1)]
        for task, rows in summary.items():
            judged = passed[task]["passed"] and part == "unseen"
            winner = best(rows, methods, part, metric) if judged else None
            label = task if passed[task]["passed"] else f"{task} (not learned — no verdict)"
            lines.append(f"| {label} | " + " | ".join(_cell(rows[m][part], metric, m == winner) if m in rows else "—"
                                                     for m in methods) + " |")
        text.append("\n".join(lines))
    return "\n\n".join(text)


def ranking_text(summary: dict[str, dict[str, dict]], methods: list[str]) -> str:
    """Methods ranked by mean unseen accuracy over the tasks that pass the gate, in both metrics."""
    text = []
    for metric, name in METRICS.items():
        ranked = ranking(summary, methods, metric)
        if not ranked:
            text.append(f"No ranking in {name}: no task passes the gate with every method run.")
            continue
        lines = [f"**Ranking, {name} on unseen lengths**, over the {len(ranked[0]['tasks'])} tasks that pass the "
                 f"gate ({', '.join(ranked[0]['tasks'])}); beats / trails RoPE = beyond 2 binomial SE and 2 seed SE of "
                 "the per-seed differences", "",
                 "| method | mean % | mean rank | beats RoPE on | trails RoPE on |", "|---|---|---|---|---|"]
        for e in ranked:
            lines.append(f"| {e['method']} | {100 * e['mean']:.1f} | {e['mean_rank']:.2f} | "
                         f"{', '.join(e['beats_baseline']) or '—'} | {', '.join(e['trails_baseline']) or '—'} |")
        text.append("\n".join(lines))
    return "\n\n".join(text)


_LOAD_NOTE = "other jobs on the machine stretch wall time, not CPU time"


def runtime_text(timing: dict) -> str:
    """Wall time of every invocation, CPU and load of the run, and the quiet-machine wall time estimated from CPU."""
    cpu = timing["train_cpu_s"] + timing["eval_cpu_s"]
    cores = timing.get("cores") or 1
    untimed = timing["runs"] - timing["train_runs_timed"]
    invocations = timing.get("invocations") or []
    if invocations:
        walls = [r["wall_s"] / 60 for r in invocations]
        where = ("in the merged parts' output directories" if timing.get("merged_parts") else
                 "on this output directory")
        wall = (f"{sum(walls):.1f} min wall in {len(walls)} invocation(s) {where} ("
                + " + ".join(f"{w:.1f}" for w in walls) + f" min, the longest {max(walls):.1f}; each up to "
                f"{max(r['jobs'] for r in invocations)} runs side by side; load average "
                + ", ".join(f"{r['load_start']} → {r['load_end']}" for r in invocations)
                + f" at each one's start → end: {_LOAD_NOTE})" + machines_text(invocations))
    elif timing.get("report_only"):
        wall = ("wall time not recorded (a --report-only report of runs whose training invocations predate "
                "timing/invocations.json)")
    else:
        wall = (f"{timing['wall_s'] / 60:.1f} min wall (this invocation; earlier ones of a resumed run were not "
                f"recorded) with {timing['jobs']} runs side by side (load average {timing['load_start']} at the "
                f"start, {timing['load_end']} at the end: {_LOAD_NOTE})")
    return (f"Runtime: {wall}; CPU time {timing['train_cpu_s'] / 60:.1f} min training + "
            f"{timing['eval_cpu_s'] / 60:.1f} min evaluation = {cpu / 60:.1f} min; **estimated** wall time on a quiet "
            f"{cores}-core machine ≈ CPU / {cores} = {cpu / cores / 60:.1f} min (an estimate, not a measurement)"
            + (f"; {untimed} run(s) trained by an earlier invocation without timing are not counted" if untimed else "")
            + ".")


DEVIATIONS = """- Models are 3-layer, d = 128 decoders trained for minutes on CPU; the papers train 6–12 layers for
  10k–2M steps. Compare directions, not magnitudes."""
# Deviations of one method, listed when the method is in the report.
METHOD_DEVIATIONS = {
    "pose": "PoSE cuts the padded training window (model.seq_length), not each example: RFS, RPE and warp follow "
            "each example's own length, PoSE does not, so a shorter example may lie wholly in the first chunk and "
            "train on one shifted run of positions (the paper's windows are full chunks of long documents).",
    "ryarn": "Randomized YaRN draws one sorted row per batch at the padded window (its paper's per-batch draw): "
             "an example of n tokens takes the row's first n positions, which reach less far into [0, L) than the "
             "n-subset RPE draws per example; its length curriculum splits the task's training steps in equal "
             "stages (the paper's are epochs).",
    "drope": "DroPE recalibrates without RoPE on the last 2 % of the task's training steps (the paper: 0.5-2 % of "
             "a pretrained model's tokens, as a separate run with a fresh optimizer): at the suite's budgets that "
             "is a handful of steps, and the Adam moments carry over the switch.",
}
METHOD_DEVIATIONS["drope_2x"] = METHOD_DEVIATIONS["posaug_drope"] = METHOD_DEVIATIONS["drope"]


def _any_unpaired(versus: dict) -> bool:
    return any(not result["paired"] for per_other in versus.values() for per_task in per_other.values()
               for result in per_task.values())


def write_report(out: Path, preset_name: str, preset, records: list[dict], seeds: list[int],
                 timing: dict, versus: dict | None = None, sources: list[str] | None = None) -> Path:
    """report.md, results.json and one plot per task under `out`.

    versus: PosAug against each row as stored by earlier reports (their records no longer hold per-example
    scores); sources: the results.json files a merged report joins (pretrain.tasks.merge).
    """
    from pretrain.tasks.compare import baseline_findings, nope_findings, paper_comparison, reach_table
    from pretrain.tasks.evaluate import without_example_scores
    from pretrain.tasks.versus import versus_all, versus_section

    summary = aggregate(records)
    methods = [m for m in preset.methods if any(m in rows for rows in summary.values())]
    plots = [plot_task(task, {m: rows[m] for m in methods if m in rows}, out / f"accuracy_{task}.png")
             for task, rows in summary.items()]
    ranges = ", ".join(f"{t} U{{{a}..{n}}} ({preset.iters(t)} steps)" for t, (a, n) in preset.tasks.items()
                       if t in summary)
    papers = paper_comparison(summary, preset.eval_count)
    if versus is None:
        versus = versus_all(records, summary, methods)
    merged = ("Merged from " + "; ".join(sources) + " (`--merge`: nothing trained or evaluated again; PosAug against "
              "each row is each part's stored paired result" + (", and unpaired, marked so, for a row from another "
              "method part" if _any_unpaired(versus) else "") + ")." if sources else "")
    report = out / "report.md"
    report.write_text("\n\n".join([
        f"# Length generalisation on algorithmic tasks ({preset_name})",
        f"Training lengths {ranges}; evaluation at every length up to {preset.eval_factor}N, "
        f"{preset.eval_count} held-out examples per length; exact match of answer + <eos> under greedy decoding "
        f"and teacher-forced per-token accuracy over the same tokens. Every method of a task trains the same steps "
        f"on the same examples; seeds {seeds}."
        + (" One seed: ± covers the sampling of held-out examples only, not training-seed variance (the papers "
           "report large seed spread; Ruoss et al. take the best of 30 runs)." if len(seeds) == 1 else
           f" ± is the standard deviation over the {len(seeds)} seeds; the binomial SE of one seed is in brackets."),
        *([merged] if merged else []),
        runtime_text(timing),
        gate_table(summary),
        tables(summary, methods),
        ranking_text(summary, methods),
        reach_table(summary, methods),
        "\n".join(f"![{p.stem}]({p.name})" for p in plots),
        "## Against the RoPE baseline (computed from the tables; Δ beyond 2 SE counts)\n\n"
        + "\n".join(baseline_findings(summary, methods)),
        versus_section(records, summary, methods, results=versus),
        "## Against NoPE (does a RoPE position augmentation beat having no positions at all?)\n\n"
        + ("\n".join(nope_findings(summary, methods)) or "NoPE was not in this run."),
        "## Against the papers (computed: direction of each published difference vs ours)\n\n"
        + ("\n".join(papers) if papers else "No published pair among this run's learned tasks and methods.")
        + "\n\nThe papers' numbers in full:\n\n" + PAPER_NUMBERS,
        "## Deviations from the papers\n\n" + DEVIATIONS + "".join(f"\n- {d}" for d in preset.deviations)
        + "".join(f"\n- {text}" for method, text in METHOD_DEVIATIONS.items() if method in methods),
    ]) + "\n")
    (out / "results.json").write_text(json.dumps(
        {"preset": preset_name, "seeds": seeds, "timing": timing, "methods": methods, "gate": gate(summary),
         "train_lengths": {t: list(r) for t, r in preset.tasks.items()},
         "budgets": {t: preset.budget(t) for t in preset.tasks},
         "ranking": {metric: ranking(summary, methods, metric) for metric in METRICS},
         "summary": summary, "versus_posaug": versus,
         **({"merged_from": sources} if sources else {}),
         # per-example scores stay in eval/<run>.json: thousands of pairs per run
         "records": [{**r, "lengths": without_example_scores(r["lengths"])} for r in records]},
        indent=1))
    return report
