"""Megatron's SelfAttention with q and k rotated by the fused float-position RoPE kernel (megatron_ext.kernels.rope).

Megatron's attention rotates q and k by two calls of `rope_utils.apply_rotary_pos_emb` (unfused: ~12 elementwise
kernels each; TE's fused kernel only for one angle table [s, 1, 1, d]). `FusedRopeSelfAttention`, swapped in for
SelfAttention through the layer spec (`model.rope_kernel`), takes the layer's angles from its `rotary_pos_emb`
argument, calls Megatron's forward without them, and rotates q and k in one launch right after
`get_query_key_value_tensors` produced them: the point where Megatron's forward would rotate them next (after the
q/k layernorms). Any call this does not cover goes to Megatron's forward unchanged: KV-cache inference, packed (THD)
sequences, a tuple of distinct q/k angles, Megatron's own YaRN config (mscale != 1), fused single-qkv RoPE, the
layers Megatron's no_rope_freq leaves without RoPE, and, with Transformer Engine's apply_rope_fusion, every call
whose angles are one shared table (TE's fused kernel takes it; per-sample angles [s, b, 1, d] come here). Angles
whose shape the kernel does not take go through Megatron's own `apply_rotary_pos_emb` at the same point.

YaRN: this project applies YaRN's attention factor through the core attention's softmax_scale (rope_hook), so the
kernel is called with mscale 1, as Megatron's forward calls apply_rotary_pos_emb for a TransformerConfig without
yarn fields. TE's `start_positions` (per-sample offsets into one stacked table, TE >= 2.10) is not used: it takes
integer offsets per sample, Transformer Engine cannot run here to test it, and this kernel covers that case.

Relied on in Megatron-Core (public names, not private ones, so not in megatron_ext.versions REACHES; checked against
megatron-core 0.16.1 only: the 0.17.1-0.19.2 wheels were not reachable from the machine this was written on):
- SelfAttention.get_query_key_value_tensors (public method, relied on as a step of forward): forward calls it once
  per call, after which q and k (its first two outputs) are what apply_rotary_pos_emb rotates; with
  rotary_pos_emb=None, forward applies no RoPE and splits qkv (split_qkv), so nothing is rotated twice.
- the layer spec's `self_attention.module` (ModuleSpec) is SelfAttention for the local and TE GPT specs.
"""

from __future__ import annotations

import copy
import logging

import torch
from megatron.core.models.common.embeddings.rope_utils import apply_rotary_pos_emb
from megatron.core.transformer.attention import SelfAttention
from megatron.core.transformer.spec_utils import ModuleSpec

from megatron_ext.kernels import rope as rope_kernel

log = logging.getLogger(__name__)

ROPE_KERNELS = ("auto", "triton", "unfused")


def chosen_rope_kernel(setting: str, *, transformer_impl: str = "local", rope: bool = True) -> str:
    """'triton' or 'unfused' for model.rope_kernel; ValueError (one line, the fix) where triton cannot run."""
    if not rope or setting == "unfused":
        return "unfused"
    on_gpu = torch.cuda.is_available()
    if setting == "auto":
        return "triton" if on_gpu and rope_kernel.available() else "unfused"
    if not rope_kernel.available():
        raise ValueError("model.rope_kernel=triton needs the triton package (pip install triton, or the CUDA "
                           "build of torch); use model.rope_kernel=auto or unfused")
    if not on_gpu and not rope_kernel.interpreting():
        raise ValueError("model.rope_kernel=triton needs a CUDA GPU (on CPU only under TRITON_INTERPRET=1, "
                           "Triton's slow interpreter, for tests); use model.rope_kernel=auto or unfused")
    return "triton"


def with_fused_rope(spec: ModuleSpec) -> ModuleSpec:
    """The GPT layer spec with FusedRopeSelfAttention in place of Megatron's SelfAttention."""
    attention = spec.submodules.self_attention
    if attention.module is not SelfAttention:
        raise ValueError(f"model.rope_kernel=triton replaces SelfAttention, but the layer spec's attention is "
                         f"{getattr(attention.module, '__name__', attention.module)}; use model.rope_kernel=unfused")
    spec = copy.deepcopy(spec)
    spec.submodules.self_attention.module = FusedRopeSelfAttention
    return spec


def rope_paths_line(config, kernel: str, *, te: bool, per_sample_positions: bool) -> str:
    """The start-up line saying which RoPE path each layer takes."""
    nope = [n + 1 for n, skip in enumerate(config.no_rope_freq or []) if skip]
    rotated = [n for n in range(1, config.num_layers + 1) if n not in nope]
    if kernel == "triton":
        path = ("Transformer Engine's fused RoPE for shared angles [s,1,1,d], the Triton kernel "
                "(megatron_ext.kernels.rope) for per-sample angles" if te and config.apply_rope_fusion else
                "the fused Triton kernel (megatron_ext.kernels.rope), q and k in one launch")
    elif config.apply_rope_fusion:
        path = "Transformer Engine's fused RoPE"
    else:
        path = "Megatron's unfused RoPE (apply_rotary_pos_emb)"
    line = f"RoPE: layers {_ranges(rotated)} take {path}"
    if per_sample_positions and te and kernel != "triton":
        line += " (per-sample positions: TE's fused RoPE needs [s] positions)"
    return line + (f"; layers {_ranges(nope)} have no RoPE (model.no_rope_freq)" if nope else "")


def _ranges(numbers: list[int]) -> str:
    return ",".join(str(n) for n in numbers) or "none"


class FusedRopeSelfAttention(SelfAttention):
    """SelfAttention whose q and k are rotated by one fused Triton launch (forward and backward)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._angles: torch.Tensor | None = None

    def _covers(self, rotary_pos_emb, args: tuple, kwargs: dict) -> bool:
        config = self.config
        if args or not torch.is_tensor(rotary_pos_emb):
            return False
        no_rope = config.no_rope_freq[self.layer_number - 1] if config.no_rope_freq else False
        shared_table = rotary_pos_emb.dim() == 4 and rotary_pos_emb.shape[1] == 1
        return not (
            no_rope
            or kwargs.get("inference_context") is not None or kwargs.get("inference_params") is not None
            or kwargs.get("packed_seq_params") is not None or kwargs.get("key_value_states") is not None
            or kwargs.get("rotary_pos_cos") is not None or kwargs.get("rotary_pos_cos_sin") is not None
            or getattr(config, "fused_single_qkv_rope", False) or getattr(config, "multi_latent_attention", False)
            or hasattr(config, "yarn_rotary_scaling_factor")  # Megatron's YaRN config: mscale != 1
            or (config.apply_rope_fusion and shared_table))

    def forward(self, hidden_states, attention_mask, key_value_states=None, inference_context=None,
                rotary_pos_emb=None, *args, **kwargs):
        """SelfAttention.forward; q and k rotated by the fused kernel where it covers the call."""
        if not self._covers(rotary_pos_emb, args, dict(kwargs, key_value_states=key_value_states,
                                                         inference_context=inference_context)):
            return super().forward(hidden_states, attention_mask, key_value_states, inference_context,
                                   rotary_pos_emb, *args, **kwargs)
        self._angles = rotary_pos_emb
        try:
            output = super().forward(hidden_states, attention_mask, key_value_states, inference_context, None,
                                     **kwargs)
            if self._angles is not None:  # fail closed: q and k went through unrotated
                raise RuntimeError("SelfAttention.forward of this megatron-core did not call "
                                   "get_query_key_value_tensors, so the fused RoPE kernel rotated nothing: "
                                   "use model.rope_kernel=unfused")
            return output
        finally:
            self._angles = None

    def get_query_key_value_tensors(self, *args, **kwargs):
        """Megatron's q, k, v (and gate), with q and k rotated when forward handed this call its angles."""
        outputs = super().get_query_key_value_tensors(*args, **kwargs)
        angles, self._angles = self._angles, None  # once per forward, also under activation recompute
        if angles is None:
            return outputs
        query, key = outputs[0], outputs[1]
        if rope_kernel.unsupported(query, key, angles) is None:
            query, key = rope_kernel.apply_rotary_qk(query, key, angles, interleaved=self.config.rotary_interleaved)
        else:  # Megatron's own unfused path, at the point its forward would take it
            query, key = (apply_rotary_pos_emb(t, angles, config=self.config, cp_group=self.pg_collection.cp)
                          for t in (query, key))
        return (query, key) + tuple(outputs[2:])

