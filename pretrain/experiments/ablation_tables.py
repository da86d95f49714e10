"""The paper's ablation Tables 5–11 (posaug.md §4.5–4.11) as data: rows, published numbers, stated conclusions.

Each row is one training run (positions.* fields, model-shape and window changes); a row used by
several tables (the baseline, PosAug U[1/8, 8], U[1/16, 16]) is trained once. Each table quotes the
paper's numbers per row and the conclusions its text draws, as comparisons the report checks
(`pretrain.experiments.ablations_report.check`). Nothing here measures anything.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from pretrain.experiments.presets import Preset

POSAUG = {"strategy": "posaug", "alpha_min": 1 / 8, "alpha_max": 8.0, "alpha_distribution": "uniform"}
DOUBLINGS = (1.0, 2.0, 4.0, 8.0)  # Table 6's discrete set and cycle order
# Table 9's shapes relative to the standard model: deep d = 288, L = 12 and wide d = 448, L = 3 against
# d = 384, L = 6 (§4.9), i.e. (layers ×, hidden ×).
SHAPES = {"deep": (2.0, 288 / 384), "wide": (0.5, 448 / 384)}


@dataclass(frozen=True)
class Row:
    """One trained model of the ablation family."""

    label: str  # as the paper names it
    positions: dict
    shape: str = "standard"  # standard | deep | wide (SHAPES)
    window_factor: int = 1  # training window = this × the preset's window, same tokens (Table 11)
    half_layers: bool = False  # positions.layer_count = num_layers // 2 (Table 10's "layers 1–3" / "4–6" of 6)


ROWS: dict[str, Row] = {
    "baseline": Row("Baseline (no aug)", {"strategy": "none"}),
    "posaug": Row("PosAug U[1/8, 8]", POSAUG),
    # Table 5
    "posaug_16": Row("PosAug U[1/16, 16]", {**POSAUG, "alpha_min": 1 / 16, "alpha_max": 16.0}),
    "posaug_32": Row("PosAug U[1/32, 32]", {**POSAUG, "alpha_min": 1 / 32, "alpha_max": 32.0}),
    # Table 6
    "fixed_8": Row("Fixed α = 8", {**POSAUG, "alpha_distribution": "fixed", "alpha_fixed": 8.0}),
    "fixed_4": Row("Fixed α = 4", {**POSAUG, "alpha_distribution": "fixed", "alpha_fixed": 4.0}),
    "discrete": Row("Discrete {1, 2, 4, 8}", {**POSAUG, "alpha_distribution": "discrete", "alpha_values": DOUBLINGS}),
    "cycle": Row("Cycling 1→2→4→8", {**POSAUG, "alpha_distribution": "cycle", "alpha_values": DOUBLINGS}),
    "random_base": Row("Random RoPE base", {"strategy": "random_base", "base_min_factor": 1 / 8,
                                            "base_max_factor": 8.0}),
    # Table 7
    "range_1_8": Row("[1, 8] (upper-only)", {**POSAUG, "alpha_min": 1.0}),
    "range_2nd_8": Row("[1/2, 8]", {**POSAUG, "alpha_min": 0.5}),
    "range_8th_1": Row("[1/8, 1] (downscale-only)", {**POSAUG, "alpha_max": 1.0}),
    # Table 8: linear widens U[1/2, 2] → U[1/8, 8] over training; step trains α = 1 for the first half
    "curriculum_linear": Row("Curriculum linear", {**POSAUG, "curriculum": "linear", "curriculum_start_min": 0.5,
                                                   "curriculum_start_max": 2.0}),
    "curriculum_step": Row("Curriculum step [1/8, 8]", {**POSAUG, "curriculum": "step", "curriculum_fraction": 0.5}),
    "log_uniform": Row("Log-uniform [1/8, 8]", {**POSAUG, "alpha_distribution": "log_uniform"}),
    "curriculum_step_16": Row("Curriculum step [1/16, 16]", {**POSAUG, "alpha_min": 1 / 16, "alpha_max": 16.0,
                                                             "curriculum": "step", "curriculum_fraction": 0.5}),
    "curriculum_step_log_uniform": Row("Curriculum step + log-uniform", {
        **POSAUG, "alpha_distribution": "log_uniform", "curriculum": "step", "curriculum_fraction": 0.5}),
    # Table 9
    "deep_baseline": Row("Deep: Baseline", {"strategy": "none"}, shape="deep"),
    "deep_posaug": Row("Deep: PosAug", POSAUG, shape="deep"),
    "wide_baseline": Row("Wide: Baseline", {"strategy": "none"}, shape="wide"),
    "wide_posaug": Row("Wide: PosAug", POSAUG, shape="wide"),
    # Table 10
    "layers_bottom": Row("Bottom layers only", {**POSAUG, "layer_mode": "bottom"}, half_layers=True),
    "layers_top": Row("Top layers only", {**POSAUG, "layer_mode": "top"}, half_layers=True),
    "layers_independent": Row("Independent per-layer", {**POSAUG, "layer_mode": "independent"}),
    # Table 11: same tokens, longer windows (fewer steps)
    "baseline_2w": Row("Baseline, 2× window", {"strategy": "none"}, window_factor=2),
    "baseline_4w": Row("Baseline, 4× window", {"strategy": "none"}, window_factor=4),
    "posaug_2w": Row("PosAug U[1/8, 8], 2× window", POSAUG, window_factor=2),
}


def row_preset(preset: Preset, row: Row) -> Preset:
    """The preset a row trains with: its window (Table 11: ×2, ×4 at the same tokens, so fewer steps)."""
    return dataclasses.replace(preset, window=preset.window * row.window_factor)


@dataclass(frozen=True)
class Claim:
    """One comparison a conclusion rests on: `row` vs `other` in `metric`.

    expected: 'lower' | 'higher' (a significant difference that way), 'similar' (none either way), or
    'not_lower' | 'not_higher' ("no better than": anything but a significant difference that way).
    """

    row: str
    other: str
    metric: str  # cliff | gain | in_dist
    expected: str


@dataclass(frozen=True)
class Conclusion:
    """A sentence of the paper and the comparisons that test it (all must hold for 'reproduced')."""

    text: str
    claims: tuple[Claim, ...]


@dataclass(frozen=True)
class Table:
    """One ablation table: its rows with the paper's numbers and its stated conclusions."""

    number: int
    title: str
    eval_factor: int  # the cliff the paper reports: at 8K = 4w (4) or 16K = 8w (8)
    paper: dict[str, dict[str, float]]  # row → {cliff, gain, in_dist, delta or penalty}
    conclusions: tuple[Conclusion, ...] = field(default=())

    @property
    def rows(self) -> tuple[str, ...]:
        """The table's rows in the paper's order (the baseline first where the paper lists it)."""
        return tuple(self.paper)


def _c(row: str, other: str, metric: str, expected: str) -> Claim:
    return Claim(row, other, metric, expected)


_BASE = {"cliff": 2.28, "gain": -0.57, "in_dist": 4.04, "delta": 0.00}
_REF = {"cliff": 1.07, "gain": 0.42, "in_dist": 4.10, "delta": 0.06}

TABLES: dict[int, Table] = {t.number: t for t in (
    Table(5, "Extended α range (cliff at 8w = the paper's 16K)", 8, {
        "baseline": {},
        "posaug": {"cliff": 0.081, "in_dist": 4.157, "penalty": 0.018},
        "posaug_16": {"cliff": 0.168, "in_dist": 4.412, "penalty": 0.080},
        "posaug_32": {"cliff": 0.077, "in_dist": 4.489, "penalty": 0.098},
    }, (
        Conclusion("Wider ranges increase the in-distribution penalty",
                   (_c("posaug_16", "posaug", "in_dist", "higher"), _c("posaug_32", "posaug_16", "in_dist", "higher"))),
        Conclusion("[1/32, 32] has the lowest cliff at 16K", (_c("posaug_32", "posaug", "cliff", "lower"),
                                                               _c("posaug_32", "posaug_16", "cliff", "lower"))),
        Conclusion("The range effect is U-shaped: [1/16, 16] has a higher cliff than [1/8, 8]",
                   (_c("posaug_16", "posaug", "cliff", "higher"),)),
    )),
    Table(6, "Is randomness necessary?", 4, {
        "baseline": _BASE, "posaug": _REF,
        "fixed_8": {"cliff": 0.29, "gain": -0.19, "in_dist": 5.69, "delta": 1.66},
        "fixed_4": {"cliff": 0.58, "gain": -0.22, "in_dist": 5.50, "delta": 1.46},
        "discrete": {"cliff": 1.05, "gain": -0.06, "in_dist": 4.10, "delta": 0.07},
        "cycle": {"cliff": 1.14, "gain": -0.09, "in_dist": 4.10, "delta": 0.06},
        "random_base": {"cliff": 1.09, "gain": -0.26, "in_dist": 4.05, "delta": 0.01},
    }, (
        Conclusion("Fixed α lowers the cliff but costs far more in-distribution than PosAug",
                   tuple(_c(f, o, m, e) for f in ("fixed_8", "fixed_4")
                         for o, m, e in (("baseline", "cliff", "lower"), ("posaug", "in_dist", "higher")))),
        Conclusion("Discrete and cycling reach a cliff like PosAug's with lower G(4w)",
                   tuple(_c(r, "posaug", m, e) for r in ("discrete", "cycle")
                         for m, e in (("cliff", "similar"), ("gain", "lower")))),
        Conclusion("Random base: a cliff like PosAug's, a minimal penalty (below PosAug's), lower G(4w)",
                   (_c("random_base", "posaug", "cliff", "similar"), _c("random_base", "posaug", "in_dist", "lower"),
                    _c("random_base", "posaug", "gain", "lower"))),
    )),
    Table(7, "Lower-bound isolation", 4, {
        "baseline": _BASE, "posaug": _REF,
        "range_1_8": {"cliff": 1.15, "gain": -0.12, "in_dist": 4.11, "delta": 0.08},
        "range_2nd_8": {"cliff": 1.15, "gain": 0.22, "in_dist": 4.11, "delta": 0.07},
        "range_8th_1": {"cliff": 2.17, "gain": 0.24, "in_dist": 4.09, "delta": 0.06},
    }, (
        Conclusion("[1/8, 1] keeps a cliff near the baseline's", (_c("range_8th_1", "baseline", "cliff", "similar"),)),
        Conclusion("Every range with b = 8 cuts the cliff",
                   tuple(_c(r, "baseline", "cliff", "lower") for r in ("posaug", "range_1_8", "range_2nd_8"))),
        Conclusion("The downscale part (a < 1) raises G(4w)", (_c("posaug", "range_1_8", "gain", "higher"),)),
    )),
    Table(8, "Curriculum, distribution and range variants", 4, {
        "baseline": _BASE, "posaug": _REF,
        "curriculum_linear": {"cliff": 0.88, "gain": 0.39, "in_dist": 4.10, "delta": 0.06},
        "curriculum_step": {"cliff": 0.72, "gain": 0.40, "in_dist": 4.09, "delta": 0.06},
        "log_uniform": {"cliff": 0.96, "gain": 0.59, "in_dist": 4.12, "delta": 0.08},
        "posaug_16": {"cliff": 0.37, "gain": 0.38, "in_dist": 4.13, "delta": 0.09},
        "curriculum_step_16": {"cliff": 0.24, "gain": 0.43, "in_dist": 4.12, "delta": 0.08},
        "curriculum_step_log_uniform": {"cliff": 0.89, "gain": 0.61, "in_dist": 4.09, "delta": 0.05},
    }, (
        Conclusion("The step curriculum lowers the cliff against i.i.d. sampling",
                   (_c("curriculum_step", "posaug", "cliff", "lower"),
                    _c("curriculum_step_16", "posaug_16", "cliff", "lower"))),
        Conclusion("A wider range lowers the cliff at a higher penalty",
                   (_c("posaug_16", "posaug", "cliff", "lower"), _c("posaug_16", "posaug", "in_dist", "higher"))),
        Conclusion("Log-uniform raises G(4w)", (_c("log_uniform", "posaug", "gain", "higher"),)),
    )),
    Table(9, "Depth vs width", 4, {
        "deep_baseline": {"cliff": 1.87, "gain": -0.53, "in_dist": 4.03},
        "deep_posaug": {"cliff": 0.80, "gain": 0.50, "in_dist": 4.09},
        "baseline": {k: v for k, v in _BASE.items() if k != "delta"},
        "posaug": {k: v for k, v in _REF.items() if k != "delta"},
        "wide_baseline": {"cliff": 2.60, "gain": -0.60, "in_dist": 4.08},
        "wide_posaug": {"cliff": 1.00, "gain": 0.23, "in_dist": 4.21},
    }, (
        Conclusion("PosAug lowers the cliff at every depth/width shape",
                   tuple(_c(f"{p}posaug", f"{p}baseline", "cliff", "lower") for p in ("deep_", "", "wide_"))),
    )),
    Table(10, "Per-layer scaling", 4, {
        "baseline": _BASE, "posaug": _REF,
        "layers_bottom": {"cliff": 2.36, "gain": -0.64, "in_dist": 4.06, "delta": 0.02},
        "layers_top": {"cliff": 1.50, "gain": -0.19, "in_dist": 4.09, "delta": 0.05},
        "layers_independent": {"cliff": 0.73, "gain": 0.04, "in_dist": 4.19, "delta": 0.15},
    }, (
        Conclusion("Bottom-only gives no benefit (no lower cliff than the baseline's)",
                   (_c("layers_bottom", "baseline", "cliff", "not_lower"),)),
        Conclusion("Top-only gives a partial benefit", (_c("layers_top", "baseline", "cliff", "lower"),
                                                        _c("layers_top", "posaug", "cliff", "higher"))),
        Conclusion("Independent per-layer: the lowest cliff with the largest penalty",
                   (_c("layers_independent", "posaug", "cliff", "lower"),
                    _c("layers_independent", "posaug", "in_dist", "higher"))),
    )),
    Table(11, "PosAug vs longer windows at the same tokens (targets split at the base window w)", 4, {
        "baseline": {k: v for k, v in _BASE.items() if k != "delta"},
        "posaug": {k: v for k, v in _REF.items() if k != "delta"},
        "baseline_2w": {"cliff": 1.32, "gain": -0.39, "in_dist": 4.39},
        "posaug_2w": {"cliff": 0.06, "gain": 0.32, "in_dist": 4.52},
        "baseline_4w": {"cliff": 0.19, "gain": -0.25, "in_dist": 5.01},
    }, (
        Conclusion("Longer windows lower the cliff but cost in-distribution loss at equal tokens",
                   tuple(_c(r, "baseline", m, e) for r in ("baseline_2w", "baseline_4w")
                         for m, e in (("cliff", "lower"), ("in_dist", "higher")))),
        Conclusion("PosAug combines with a longer window", (_c("posaug_2w", "baseline_2w", "cliff", "lower"),)),
    )),
)}


def rows_of(tables: list[int]) -> list[str]:
    """The distinct rows the given tables need, baseline and PosAug first (shared rows once)."""
    out = ["baseline", "posaug"]
    for number in tables:
        out += [row for row in TABLES[number].rows if row not in out]
    return out


# The scales the ablation suite runs at (`reproduce --suite ablations --preset`).
PRESETS = {
    # The cpu-small model (0.8M non-embedding parameters), w = 64, eval at 8w; 27 runs per seed.
    # 819,200 tokens a run (400 steps of 32 × 64): sized so one seed of all seven tables trains and
    # evaluates in ~80 min on 2 cores shared with other jobs (benchmarks/README.md has the measurement).
    "cpu-small": Preset(model="cpu-small", window=64, vocab_size=4096, train_tokens=819_200,
                        global_batch_size=32, micro_batch_size=32, lr=3e-3, eval_length=8 * 64,
                        num_spans=200, gain_window=16, corpus_bytes=6_000_000,
                        valid_fraction=0.15, gain_spans=20),
    # The whole suite end to end in a few minutes (tests); the numbers mean nothing.
    "cpu-tiny": Preset(model="tiny", window=16, vocab_size=512, train_tokens=4_096, global_batch_size=16,
                       micro_batch_size=16, lr=3e-3, eval_length=8 * 16, num_spans=16,
                       gain_window=4, corpus_bytes=400_000, valid_fraction=0.1, gain_spans=4),
}
