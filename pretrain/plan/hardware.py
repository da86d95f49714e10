"""GPUs the plan knows: memory, dense peak FLOP/s, and the MFU assumed when none is given.

Memory is the datasheet capacity in GB (10^9 bytes), which is below what the driver reports
(e.g. an H100 80GB reports 79.2 GiB = 85.0e9 bytes): the plan errs on the side of not fitting.
Peaks are dense (no sparsity) tensor-core TFLOP/s from NVIDIA's datasheets; BF16 peaks equal
pretrain/trainer/peak.py's PEAK_TFLOPS for the same family (a test keeps them equal).

Default MFU, published for Megatron-Core / Megatron-LM:
- Hopper (H100, H200): 47 %. Megatron-LM README, "Training speed and scalability": Megatron-Core
  trains GPT models of 2B to 462B parameters "with up to 47% Model FLOP Utilization (MFU) on H100
  clusters" (github.com/NVIDIA/Megatron-LM). The H200 has the same compute as the H100 SXM.
- Ampere (A100): 33 %. Narayanan et al., "Efficient Large-Scale Language Model Training on GPU
  Clusters Using Megatron-LM" (SC21, arXiv 2104.04473), Table 1: the smallest model (1.7B) reaches
  44 % of the A100's peak counting the FLOPs of activation recomputation (an extra forward pass,
  4 passes instead of 3), i.e. 44 % × 3/4 = 33 % MFU.
- L40S: no published Megatron figure; the A100 value is used.
These figures come from billion-parameter models; the 10M–113M models of table.py use far less of a
GPU (small matmuls, launch overhead). Where a size was measured on a GPU, pretrain/plan/measured.py's figure
replaces the published one; for the others, measure a few steps and pass --mfu.
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 10**9
GIB = 2**30


@dataclass(frozen=True)
class Gpu:
    """One GPU model: datasheet memory and dense peaks, and the MFU assumed for it."""

    label: str
    memory_gb: float
    bf16_tflops: float
    fp8_tflops: float | None
    mfu: float
    mfu_source: str
    family: str  # the key of pretrain.trainer.peak.PEAK_TFLOPS with the same BF16 peak

    @property
    def memory_bytes(self) -> int:
        """Datasheet capacity in bytes."""
        return int(self.memory_gb * GB)


_HOPPER = "Megatron-LM README: up to 47% MFU on H100 (GPT 2B-462B)"
_AMPERE = "Narayanan et al. SC21 Table 1: 44% of peak incl. recompute = 33% MFU (1.7B, A100)"

GPUS: dict[str, Gpu] = {
    "h100-80gb": Gpu("NVIDIA H100 SXM 80GB", 80, 989.0, 1979.0, 0.47, _HOPPER, "H100"),
    "h100-94gb": Gpu("NVIDIA H100 NVL 94GB", 94, 835.0, 1670.0, 0.47, _HOPPER, ""),  # NVL: lower clocks
    "h200": Gpu("NVIDIA H200 SXM 141GB", 141, 989.0, 1979.0, 0.47, _HOPPER, "H200"),
    "a100-80gb": Gpu("NVIDIA A100 SXM 80GB", 80, 312.0, None, 0.33, _AMPERE, "A100"),
    "a100-40gb": Gpu("NVIDIA A100 SXM 40GB", 40, 312.0, None, 0.33, _AMPERE, "A100"),
    "l40s": Gpu("NVIDIA L40S 48GB", 48, 362.0, 733.0, 0.33, "no published Megatron figure: the A100's", "L40S"),
}
DEFAULT_GPU = "h100-80gb"

# What a training process holds besides tensors: the CUDA context with its loaded kernels (about
# 0.5 GiB with lazy loading), cuBLAS/cuDNN workspaces, and NCCL's communicator buffers (a few hundred
# MiB per communicator on a DGX-class node): 2 GiB in all, stated, overridable with --allowance-gib.
CONTEXT_ALLOWANCE_BYTES = 2 * GIB
# Caching-allocator fragmentation on the dynamic part (activations, logits): Megatron's own
# overhead_factor of 1.05 in compute_activation_memory_without_sp.
FRAGMENTATION = 0.05
