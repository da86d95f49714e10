"""MFU measured on a GPU, per (GPU, size): what `plan` assumes instead of a published figure where one exists.

Each entry names the stored log it comes from; tests/plan/test_plan_measured_mfu.py re-reads that log, rebuilds
the measured model from the lease's stored config, and recomputes the MFU by megatron_ext.model_config's
FLOP_CONVENTION, so an entry cannot drift from its file.

Only one process alone on the GPU counts: six runs side by side share the GPU (each one's rate says nothing of a
run alone), and the rate of a window that includes start-up is not a step's. The measured model's vocabulary may
differ from the planned config's (gpu-10m trains on the embedded corpus's 4,096 tokens; the shipped 10m config has
50,257, padded to 50,304): the MFU, the fraction of the peak a step uses, is carried over unchanged. A larger
vocabulary adds FLOPs in one large matmul and the cross-entropy, work that a host-bound step partly hides (the
measured process ran at 893.6K tokens/s where six side by side reached 1.56M+ together:
benchmarks/results/gpu_h200_side_by_side_rates.txt), so the carried-over MFU likely overstates the time; for a
job's --time that errs on the side of finishing early. Not measured yet. The benchmark `benchmarks/bench_gpu_step.py --preset 10m`
measures the 50,304 vocabulary where a GPU is available.
"""

from __future__ import annotations

from dataclasses import dataclass

RESULTS = "benchmarks/results"


@dataclass(frozen=True)
class MeasuredMfu:
    """One measured step rate and its MFU by FLOP_CONVENTION, with the file it comes from."""

    gpu: str  # a key of pretrain.plan.hardware.GPUS
    size: str  # a key of pretrain.table.SIZES
    tokens_per_s: float
    mfu: float  # tokens_per_s x flops_per_token of the measured model / the GPU's BF16 peak
    vocab_size: int  # the measured model's padded vocabulary
    precision: str
    conditions: str
    log: str  # relative to the repository root
    config: str  # the stored config of the same lease, for the model's shape

    def source(self, planned_vocab: int) -> str:
        """Where plan's MFU comes from, and how it was carried to `planned_vocab`."""
        carried = ("" if planned_vocab == self.vocab_size else
                   f"; vocabulary {self.vocab_size:,} measured, {planned_vocab:,} planned: MFU carried over unchanged")
        return (f"measured: {self.size} at {self.tokens_per_s / 1e3:,.1f}K tokens/s, {self.conditions}, "
                f"{self.log}{carried}")


MEASURED: tuple[MeasuredMfu, ...] = (
    MeasuredMfu(gpu="h200", size="10m", tokens_per_s=893_600, mfu=0.1173, vocab_size=4096, precision="bf16",
                conditions="one process, bf16, local layers + SDPA, no Transformer Engine, distributed optimizer, "
                           "micro-batch 16 x 8",
                log=f"{RESULTS}/gpu_h200_10m_methods/logs/calibration_first_lease.log",
                config=f"{RESULTS}/gpu_h200_10m_methods/configs/baseline_s42.yaml"),
)


def measured_mfu(gpu: str, size: str, precision: str) -> MeasuredMfu | None:
    """The measurement of `size` on `gpu` in `precision`, or None (never measured: plan uses the published MFU)."""
    for entry in MEASURED:
        if (entry.gpu, entry.size, entry.precision) == (gpu, size, precision):
            return entry
    return None
