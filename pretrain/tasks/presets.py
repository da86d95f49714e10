"""The task suite's methods and presets: what each (task, method) run trains, for how long, evaluated where.

A preset fixes per task the training range U{a..N} and a budget (steps, learning rate, batch,
model overrides). Every method of a task gets the task's budget, so the methods differ only in
positions. Budgets are chosen so that the RoPE baseline passes the learnability gate (≥ 95 % exact
match on seen lengths, pretrain.tasks.verdict); benchmarks/README.md records how each was found.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from pretrain.table import DROPE, DROPE_SHARE, I_ROPE, I_ROPE_FLOOR, P_ROPE, SSMAX, SWA_HYBRID, SWA_WINDOW


@dataclass(frozen=True)
class Method:
    """A row of the suite: model.* and positions.* fields (max_position resolved per task)."""

    model: dict
    positions: dict
    # positions.max_position: "eval" = the longest evaluation input (RPE must cover it; RFS on ALiBi
    # uses "the maximum input length of the dataset", RFS App. B.4); "rfs" = 8 × the training window.
    max_position: str | None = None
    # model.* fields that scale with the task's training window w: (name, w -> value), as pretrain.table's
    model_in_windows: tuple[tuple[str, Callable[[int], float]], ...] = ()

    def model_fields(self, window: int) -> dict:
        """The `model` fields of this row at training window `window`."""
        return {**self.model, **{name: rule(window) for name, rule in self.model_in_windows}}


METHODS: dict[str, Method] = {
    "baseline": Method({}, {"strategy": "none"}),  # RoPE without augmentation, as table.METHODS["baseline"]
    "posaug": Method({}, {"strategy": "posaug", "alpha_min": 0.125, "alpha_max": 8.0, "alpha_distribution": "uniform"}),
    # per_sample: the papers draw one sorted position row per example, not one per microbatch.
    "rfs": Method({}, {"strategy": "rfs", "granularity": "per_sample"}, max_position="rfs"),
    "rpe": Method({}, {"strategy": "rpe", "granularity": "per_sample"}, max_position="eval"),
    "warp": Method({}, {"strategy": "warp", "p_head": 0.15, "p_tail": 0.15, "tail_function": "sqrt"}),
    "nope": Method({"position_embedding_type": "none"}, {"strategy": "none"}),
    "alibi": Method({"position_embedding_type": "alibi"}, {"strategy": "none"}),
    "rfs_alibi": Method({"position_embedding_type": "alibi"}, {"strategy": "rfs", "granularity": "per_sample"},
                        max_position="eval"),
}
POSAUG_POSITIONS = METHODS["posaug"].positions
# The rows above are every preset's default; what 2025 models ship (pretrain/table.py's rows, issue 40) are opt-in
# with --methods, as in the LM table. The probe model has 3 layers, where Llama 4's one-in-four would leave no NoPE
# layer: its last layer is the NoPE one (no_rope_freq = 3), with the temperature floor at the task's window.
DEFAULT_METHODS = tuple(METHODS)
_I_ROPE_3 = {**I_ROPE, "no_rope_freq": 3}
METHODS.update({
    "prope": Method(P_ROPE, {"strategy": "none"}),
    "irope": Method(_I_ROPE_3, {"strategy": "none"}, model_in_windows=I_ROPE_FLOOR),
    "ssmax": Method({}, {"strategy": "none"}, model_in_windows=SSMAX),
    # PoSE's skipped positions cover the same 8w target range as RFS's
    "pose": Method({}, {"strategy": "pose", "pose_chunks": 2}, max_position="rfs"),
    "posaug_prope": Method(P_ROPE, POSAUG_POSITIONS),
    "posaug_irope": Method(_I_ROPE_3, POSAUG_POSITIONS, model_in_windows=I_ROPE_FLOOR),
    # Local/global attention (issue 57): the probe's layers 1 and 3 see w/8 keys back, layer 2 all; PosAug on
    # layer 2 only (positions.layer_mode=global).
    "swa_hybrid": Method(SWA_HYBRID, {"strategy": "none"}, model_in_windows=SWA_WINDOW),
    "posaug_swa_hybrid": Method(SWA_HYBRID, {**POSAUG_POSITIONS, "layer_mode": "global"},
                                model_in_windows=SWA_WINDOW),
    # Randomized YaRN (issue 69): its range, as RPE's, covers the longest evaluation input, YaRN at s = L / w;
    # one draw per batch, as its paper.
    "ryarn": Method({}, {"strategy": "ryarn"}, max_position="eval"),
    # DroPE (issue 69): the last 2 % of the task's steps without RoPE (twice that), PosAug before the switch.
    "drope": Method({}, DROPE),
    "drope_2x": Method({}, {**DROPE, "drope_share": 2 * DROPE_SHARE}),
    "posaug_drope": Method({}, {**POSAUG_POSITIONS, **DROPE, "drope_pretraining": "posaug"}),
})


@dataclass(frozen=True)
class SuitePreset:
    """Tasks with their training range (a, N), model, budget and evaluation of one suite."""

    tasks: dict[str, tuple[int, int]]
    model: dict
    train_iters: int
    global_batch_size: int
    lr: float
    eval_factor: int = 4  # evaluate lengths 1 .. eval_factor · N
    eval_count: int = 200  # examples per length
    methods: tuple[str, ...] = DEFAULT_METHODS
    # task -> overrides of train_iters, lr, global_batch_size (numbers) and model (a dict merged into model)
    budgets: dict[str, dict] = field(default_factory=dict)
    # task -> longest evaluated length (instead of eval_factor · N), e.g. Ruoss et al.'s 500
    eval_to: dict[str, int] = field(default_factory=dict)
    eval_stride: int = 1  # evaluate every eval_stride-th unseen length (all seen lengths always)
    deviations: tuple[str, ...] = ()  # what this preset scales down from the papers, for the report

    def eval_max(self, task: str) -> int:
        """Longest evaluated length of `task`."""
        return self.eval_to.get(task, self.eval_factor * self.tasks[task][1])

    def eval_lengths(self, task: str, min_length: int) -> list[int]:
        """Evaluated lengths of `task`: every seen length, then every eval_stride-th one up to eval_max."""
        hi = self.tasks[task][1]
        return list(range(min_length, hi + 1)) + list(range(hi + 1, self.eval_max(task) + 1))[self.eval_stride - 1::
                                                                                                self.eval_stride]

    def budget(self, task: str) -> dict:
        """train_iters, lr, global_batch_size and model of `task` (the preset's, with the task's overrides)."""
        extra = self.budgets.get(task, {})
        return {"train_iters": extra.get("train_iters", self.train_iters), "lr": extra.get("lr", self.lr),
                "global_batch_size": extra.get("global_batch_size", self.global_batch_size),
                "model": {**self.model, **extra.get("model", {})}}

    def iters(self, task: str) -> int:
        """Training steps of every method on `task`."""
        return self.budget(task)["train_iters"]


# d 128, 4 heads (the copy-task probe's model, SwiGLU/RMSNorm as everywhere here).
_PROBE_MODEL = dict(num_layers=3, hidden_size=128, ffn_hidden_size=352, num_attention_heads=4,
                    num_query_groups=4)
PRESETS: dict[str, SuitePreset] = {
    # Default, ≤ 30 min on 2 cores: copy and reverse (the tasks the RoPE baseline must learn to
    # ≥ 95 % on seen lengths), N = 10, all 8 methods, one seed: 16 runs. Measured 2026-11-23
    # (benchmarks/README.md): RoPE 100 % seen on both at 1,000 steps (train loss 0.02 by step 500,
    # 0.0004 at 1,000), 0 % unseen; every method ≥ 99.7 % seen. One run ≈ 105–145 s CPU at 1 thread
    # (~0.11 s/step + ~8 s start-up), evaluation ≈ 9 s CPU per run: 35 CPU-min in all ≈ 17.5 min on
    # 2 quiet cores (estimate from CPU time; 30.5 min wall measured under load 3–20). More tasks or
    # 1,500+ steps would not fit: N = 20 (cpu-papers) doubles the per-step cost.
    "cpu-small": SuitePreset(tasks={"copy": (1, 10), "reverse": (1, 10)}, model=_PROBE_MODEL,
                             train_iters=1000, global_batch_size=64, lr=1e-3),
    # Every task learned in distribution (the learnability gate), 8 methods; one seed ≈ 90 min on 2 quiet cores
    # (a run of --num-seeds 2 is two such blocks, resumable). Budgets from RoPE probes (benchmarks/README.md,
    # "cpu-long calibration"): copy / copy2 / reverse at N = 10 are learned by 600 steps (99.9 % seen in the
    # 600-step run); duplicate N = 10 is at 99.8 % seen at step 1,200 of 1,600; missing duplicate N = 10 is at
    # 94 % seen after 1,000 steps and 99 % after 1,500 in the probe, but the evidence run's 1,500-step schedule
    # left RoPE at 89.0 % (seed 42: its loss plateaued near 0.2 until step ~1,200, then dropped), so 3,000;
    # summation is cut to N = 5 (N = 8 was at 31 % after
    # 600 steps; N = 5 reaches 99 % at step 1,500 of 2,000 in the seed-42 probe), 2,000 steps: the evidence run's
    # 1,500-step schedule left RoPE at 99.5 % (seed 42) but 87.9 % (seed 137), a mean below the gate;
    # sort to N = 3 (1–4-digit items make its window
    # ~6 tokens per item; N = 5 was at 47.5 %; N = 4 reached 93 % at step 1,500 and 96 % at 2,000, with
    # n ≤ 3 at 95–100 % by 1,500); addition to N = 4 digits at lr 2e-3 (N = 5 at 3e-3 reached only 67 % in
    # 1,600 steps: the most-significant-digit-first answer needs the carry before it is written; N = 4 at
    # 2e-3 reached 99.3 % in 2,000 steps, given 2,400 here for a margin on other seeds).
    "cpu-long": SuitePreset(
        tasks={"copy": (1, 10), "reverse": (1, 10), "duplicate": (1, 10), "missing_duplicate": (1, 10),
               "copy2": (1, 10), "summation": (1, 5), "sort": (1, 3), "addition": (2, 4)},
        model=_PROBE_MODEL, train_iters=600, global_batch_size=64, lr=1e-3,
        budgets={"copy2": {"train_iters": 500}, "duplicate": {"train_iters": 1200},
                 "missing_duplicate": {"train_iters": 3000}, "summation": {"train_iters": 2000},
                 "sort": {"train_iters": 1500}, "addition": {"train_iters": 2400, "lr": 2e-3}}),
    # Every task and every method at a budget that runs in one sitting (benchmarks/README.md has its
    # measured wall and CPU time): the copy-like tasks at cpu-small's N = 10, addition and summation
    # at the warping paper's N = 8, sort at N = 5 (its window is ~6 tokens per unit of length, so
    # N = 8 would triple sort's per-step and evaluation cost); 600 steps (cpu-small's RoPE copy loss
    # was 0.02 by step 500), 200 examples per length. 64 runs.
    # Kept under this name so the 2026-11-23 run (results/tasks_cpu-long-600_seed42*) stays reproducible: its
    # RoPE baseline missed the learnability gate on 5 of 8 tasks, so it is superseded by cpu-long above.
    "cpu-long-600": SuitePreset(tasks={"copy": (1, 10), "copy2": (1, 10), "reverse": (1, 10), "addition": (2, 8),
                                       "sort": (1, 5), "summation": (1, 8), "duplicate": (1, 10),
                                       "missing_duplicate": (1, 10)},
                                model=_PROBE_MODEL, train_iters=600, global_batch_size=64, lr=1e-3),
    # The papers' ranges (copy/reverse N = 20 as the warping paper, the others 8), 3,000 steps. Not run
    # end to end: ≈ 840 CPU-min ≈ 7 h on 2 quiet cores, extrapolated from 60-step measurements per task
    # (benchmarks/bench_task_suite_cost.py, benchmarks/README.md).
    "cpu-papers": SuitePreset(tasks={"copy": (1, 20), "copy2": (1, 20), "reverse": (1, 20), "addition": (2, 8),
                                     "sort": (1, 8), "summation": (1, 8), "duplicate": (1, 20),
                                     "missing_duplicate": (1, 20)},
                              model=_PROBE_MODEL, train_iters=3000, global_batch_size=64, lr=1e-3),
    # The papers' protocol (Ruoss et al.: train lengths U{1..40}, test every length 41..500, per-token accuracy
    # averaged over them; RFS / warping: exact match per length) on the tasks that have it: copy, copy2,
    # reverse, sort (RFS) and duplicate, missing_duplicate (Ruoss). For a GPU: 12k CPU-hours would not do.
    # Scaled down from the papers: a 5-layer d 256 decoder (Ruoss: 5-layer encoder; RFS: 12-layer GPT-2),
    # 10k steps of 128 (Ruoss 2M; RFS 40k), one learning rate (Ruoss sweep 1e-4..5e-4 × 10 seeds, best run),
    # 200 examples per length (Ruoss 500); sort keeps 1-4 digit items, so its length-500 inputs are ~5k tokens.
    # Run smaller with --train-iters / --eval-count / --eval-stride (the report lists what was scaled).
    "papers-protocol": SuitePreset(
        tasks={"copy": (1, 40), "copy2": (1, 40), "reverse": (1, 40), "sort": (1, 40), "duplicate": (1, 40),
               "missing_duplicate": (1, 40)},
        model=dict(num_layers=5, hidden_size=256, ffn_hidden_size=704, num_attention_heads=8, num_query_groups=8),
        train_iters=10_000, global_batch_size=128, lr=3e-4,
        eval_to={t: 500 for t in ("copy", "copy2", "reverse", "sort", "duplicate", "missing_duplicate")},
        deviations=("papers-protocol: 10k steps × 128 (Ruoss et al. 2M × 128, RFS 40k), one learning rate "
                    "3e-4 and the suite's seeds (Ruoss: best of 3 learning rates × 10 seeds), 5-layer d 256 "
                    "decoder-only model with greedy decoding (Ruoss: encoder, all outputs at once).",)),
    # Seconds-scale smoke run of the whole pipeline (CI); numbers are not meaningful.
    "cpu-tiny": SuitePreset(tasks={"copy": (1, 3)}, model=dict(num_layers=1, hidden_size=32, ffn_hidden_size=64,
                                                              num_attention_heads=2, num_query_groups=2),
                            train_iters=3, global_batch_size=8, lr=1e-3, eval_count=4),
}


