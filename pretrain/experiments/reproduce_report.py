"""The reproduction's report: report.md (tables and notes), results.json and its plots."""

from __future__ import annotations

import json
import math
from pathlib import Path

from pretrain.experiments.presets import Preset


def _fmt(pair: tuple[float, float] | None, digits: int = 3, percent: bool = False) -> str:
    if pair is None:
        return "—"
    mean, sd = pair
    scale, suffix = (100, " %") if percent else (1, "")
    text = f"{mean * scale:.{digits}f}"
    return text + (f" ± {sd * scale:.{digits}f}" if math.isfinite(sd) else "") + suffix


def write_report(out: Path, preset_name: str, preset: Preset, summary: dict, records: list[dict],
                 seeds: list[int], elapsed: float) -> Path:
    """report.md (tables), results.json and the plots."""
    from pretrain.evaluation.report import plot_context_gain, plot_loss_curves

    w, L = preset.window, preset.eval_length
    gain_columns = [f"G({c})" for c in sorted(next(iter(summary.values()))["gain"])]
    header = "| " + " | ".join(["Method", "n", "In-dist loss", "Loss > w", "Cliff", "Cliff SE (spans)",
                                "Paired cliff reduction vs baseline", "In-dist penalty", *gain_columns]) + " |"
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    order = [m for m in preset.methods if m in summary] + [m for m in preset.inference if m in summary]
    for label in order:
        s = summary[label]
        paired = "—" if label == "baseline" or "paired_reduction" not in s else (
            f"{s['paired_reduction'][0]:.3f} ± {s['paired_se'][0]:.3f} SE "
            f"({s['paired_reduction'][0] / max(s['paired_se'][0], 1e-12):.0f} SE)")
        lines.append(f"| {label} | {s['n']} | {_fmt(s['in_dist'])} | {_fmt(s['ood'])} | {_fmt(s['cliff'])} | "
                     f"{s['cliff_se'][0]:.3f} | {paired} | "
                     f"{'—' if label == 'baseline' else _fmt(s.get('penalty'), 1, percent=True)} |"
                     + "".join(f" {_fmt(v)} |" for _, v in sorted(s["gain"].items())))
    from pretrain.experiments.reproduce_versus import comparisons

    versus = comparisons(records, order)
    plots = {"loss": plot_loss_curves(records, out / "per_position_loss.png"),
             "gain": plot_context_gain(records, out / "context_gain.png") if preset.gain_spans else None,
             "bars": _plot_bars(summary, order, out / "cliff_and_penalty.png")}
    text = f"""# Reproduction report — preset `{preset_name}`

Model preset `{preset.model}`, training window w = {w}, {preset.train_tokens:,} training tokens per model,
seeds {seeds}, same data order and initial weights for every method of a seed. Evaluation: {preset.num_spans}
contiguous spans of {L} tokens (8w) at offsets 0, L, 2L, … of the validation stream, identical for all models;
one full-context pass per span at the model's evaluation positions. In-distribution = target positions
{preset.in_dist_start}–{w}, beyond the window = positions > {w}; cliff = difference. Mean ± sd over seeds.
The paired cliff reduction compares each method with the baseline of the same seed span by span
(same tokens), and reports its standard error over spans.{_gain_and_inference(preset, order)}

{chr(10).join(lines)}

{_gain_note(summary, preset)}
{_versus_text(versus, order)}

{' '.join(f"![{name}]({path.name})" for name, path in plots.items() if path is not None)}

Total time: {elapsed / 60:.1f} min.
"""
    (out / "report.md").write_text(text)
    (out / "results.json").write_text(json.dumps({"preset": preset_name, "seeds": seeds, "summary": summary,
                                                  "versus": versus},
                                                 indent=1, default=str))
    return out / "report.md"


def _versus_text(results: list[dict], order: list[str]) -> str:
    """PosAug against each other trained row and each composition against its part
    (pretrain.experiments.reproduce_versus), and why PosAug's are missing when it was not trained."""
    from pretrain.experiments.reproduce_versus import comparison_lines

    missing = ("\nNo PosAug-against-row verdicts: posaug was not among this run's --methods (add it to compare it "
               "with every row).\n" if "posaug" not in order else "")
    if not results:
        return missing
    return (missing + "\nPosAug against each trained row, and each PosAug composition against its part (what PosAug "
            "adds to it), paired span by span per seed (Δ = first − second; lower is better for both; a win or loss "
            "beats 2 paired SE and 2 seed SE, else a tie):\n\n" + "\n".join(comparison_lines(results)) + "\n")


def _gain_note(summary: dict, preset: Preset) -> str:
    """What the measured G(C) values say, in words."""
    if not preset.gain_spans:
        return "G(C) was not computed in this run."
    values = [mean for entry in summary.values() for mean, _ in entry["gain"].values()]
    negative = sum(v < 0 for v in values)
    note = (f"Positive G(C) means a model gains from context beyond the {preset.gain_window}-token window. "
            f"Here {negative} of {len(values)} G(C) values are negative")
    if negative > len(values) / 2:
        note += ": at this scale the models use little long-range context, and that is what this run measured"
    return note + "."


def _plot_bars(summary: dict, order: list[str], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    cliffs = [summary[m]["cliff"] for m in order]
    left.bar(order, [c[0] for c in cliffs], yerr=[0 if not math.isfinite(c[1]) else c[1] for c in cliffs])
    left.set_ylabel("cliff (nats)")
    penalties = [summary[m].get("penalty", (0.0, math.nan))[0] * 100 for m in order]
    right.bar(order, penalties)
    right.set_ylabel("in-distribution penalty (%)")
    for ax in (left, right):
        ax.tick_params(axis="x", rotation=45)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _gain_and_inference(preset, order: list[str]) -> str:
    """The paragraph's sentences on G(C) and the inference-time rows, only where the report has them."""
    text = ""
    if preset.gain_spans:
        text += (f" G(C) is the exact context gain (every target sees exactly its {preset.gain_window} predecessors, "
                 f"window = w/4 as the paper's 512 = 2048/4) at C = 2w, 4w, 8w, on the first {preset.gain_spans} "
                 "spans.")
    inference = [m for m in order if m in preset.inference]
    if inference:
        text += (f" Inference-time rows ({', '.join(inference)}) rescale the baseline's RoPE (s = L/w, default "
                 "settings).")
    return text
