"""The reproduction's presets: model, window, budget and evaluation of each `reproduce --preset`.

Below `reproduce` (which runs them) and `reproduce_report` (which describes them).
"""

from __future__ import annotations

from dataclasses import dataclass

from pretrain.evaluation.ranges import cliff_in_start
from pretrain.table import EXTRAPOLATION

# Training-time method rows (names in table.METHODS); the paper's Tables 2/4/6/7.
PAPER_METHODS = ("baseline", "posaug", "posaug_step", "posaug_log_uniform", "rfs", "rpe", "warp", "nope", "alibi")
# What 2025 models ship (p-RoPE, Llama 4's NoPE interleave, SSMax, PoSE), alone and combined with PosAug.
MODERN_METHODS = ("prope", "irope", "ssmax", "pose", "posaug_prope", "posaug_irope")
# What production models train with (local/global attention, RNoPE-SWA, sinks, QK-norm), two with PosAug.
RECIPE_METHODS = ("swa_hybrid", "posaug_swa_hybrid", "rnope_swa", "sinks", "qknorm", "posaug_qknorm")
# The 2026 challengers (issue 69): Randomized YaRN; DroPE (its recalibration share and twice it, after PosAug).
CHALLENGER_METHODS = ("ryarn", "drope", "drope_2x", "posaug_drope")
# Every method row `reproduce --preset P --methods ...` trains, locally and as `reproduce --slurm --preset P`.
TRAINING_METHODS = PAPER_METHODS + MODERN_METHODS + RECIPE_METHODS + CHALLENGER_METHODS
# The default presets stay within ~30 min on 2 cores: NoPE/ALiBi rows (Table 15) run in cpu-long and
# cpu-tiny, and in cpu-small with --methods; the MODERN_METHODS rows run with --methods (benchmarks/README.md).
ROPE_METHODS = PAPER_METHODS[:-2]
# Inference-time transforms applied to the baseline (paper §4.4: s = L_eval / w, default settings).
INFERENCE = {"baseline+pi": "pi", "baseline+ntk": "ntk", "baseline+yarn": "yarn"}


@dataclass(frozen=True)
class Preset:
    """Sizes of one reproduction: model (a size of table.SIZES), budget, evaluation."""

    model: str
    window: int
    vocab_size: int
    train_tokens: int
    global_batch_size: int
    micro_batch_size: int
    lr: float
    eval_length: int
    num_spans: int
    gain_window: int
    corpus_bytes: int
    valid_fraction: float
    gain_spans: int = 40  # exact G(C) costs a pass per target token: computed on the first spans only; 0 = skip
    methods: tuple[str, ...] = PAPER_METHODS  # the default rows; --methods picks any of TRAINING_METHODS
    inference: tuple[str, ...] = tuple(INFERENCE)
    gpu: bool = False  # trained on a GPU: `reproduce --slurm` submits it to GPU nodes through its size's launchers

    @property
    def in_dist_start(self) -> int:
        """First in-distribution target of the cliff (pretrain/evaluation/ranges.py: one definition)."""
        return cliff_in_start(self.window)

    @property
    def train_iters(self) -> int:
        """Optimizer steps of each training run."""
        return self.train_tokens // (self.global_batch_size * self.window)


PRESETS = {
    # ~1.4M parameters, w = 64, 1.64M tokens per model (~3.5 min each on 2 cores), eval at 8w.
    "cpu-small": Preset(model="cpu-small", window=64, vocab_size=4096, train_tokens=1_638_400,
                        global_batch_size=32, micro_batch_size=32, lr=3e-3, eval_length=EXTRAPOLATION * 64,
                        num_spans=400, gain_window=16, corpus_bytes=6_000_000,
                        valid_fraction=0.15, methods=ROPE_METHODS),
    # longer: twice the window, 4x the tokens, eval at 8w; the baseline's cliff passes 1 nat here
    # (1.107 +- 0.063 measured; cpu-small's is 0.34). ~11 min of training per model on 2 cores.
    "cpu-long": Preset(model="cpu-small", window=128, vocab_size=4096, train_tokens=6_553_600,
                       global_batch_size=32, micro_batch_size=32, lr=3e-3, eval_length=EXTRAPOLATION * 128,
                       num_spans=100, gain_window=32, corpus_bytes=6_000_000,
                       valid_fraction=0.15, gain_spans=10),
    # The paper's 10m model at w = 2048 on one GPU, the paper's 500M tokens, eval at 16K (8w); bf16 and the local
    # layers come from --set (benchmarks/gpu_lease.py). ~9.3 min per run measured on an H200 without Transformer
    # Engine (benchmarks/results/gpu_h200_notes.md; `plan` now assumes that measured MFU); the embedded corpus's 4096-token
    # vocabulary, so pass --input for real text.
    "gpu-10m": Preset(model="10m", window=2048, vocab_size=4096, train_tokens=500_000_000,
                      global_batch_size=128, micro_batch_size=16, lr=6e-4, eval_length=EXTRAPOLATION * 2048,
                      num_spans=16, gain_window=512, corpus_bytes=6_000_000,
                      valid_fraction=0.15, gain_spans=0, gpu=True),
    # The suite's run of the README's own-corpus command (tests/experiments/test_reproduce.py): the tiny model on
    # ~400 KB of text, trained 600 steps (cpu-tiny's 16 show no cliff at all), evaluated at 8w on the 48 spans its
    # 10 % validation split holds; PosAug's paired cliff reduction must beat 2 SE and its cliff be within 2 SE of 0
    # (measured 0.901 -> -0.026: benchmarks/results/own_corpus_suite_preset.md).
    "cpu-mini": Preset(model="tiny", window=32, vocab_size=512, train_tokens=307_200, global_batch_size=16,
                       micro_batch_size=16, lr=3e-3, eval_length=EXTRAPOLATION * 32, num_spans=48,
                       gain_window=8, corpus_bytes=400_000, valid_fraction=0.1, gain_spans=4),
    # seconds-scale smoke run of the whole pipeline (tests); numbers are not meaningful.
    "cpu-tiny": Preset(model="tiny", window=32, vocab_size=512, train_tokens=8_192, global_batch_size=16,
                       micro_batch_size=16, lr=3e-3, eval_length=128, num_spans=24,
                       gain_window=8, corpus_bytes=400_000, valid_fraction=0.1),
}
