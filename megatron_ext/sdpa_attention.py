"""Megatron's local core attention computed by torch's scaled_dot_product_attention (SDPA).

Megatron-Core's `DotProductAttention` (the local layer spec's core attention) materialises the
[b·np, sq, sk] scores with baddbmm, masks and soft-maxes them, and multiplies back with bmm.
On CPU that is most of the gap to a plain PyTorch loop (benchmarks/bench_vs_torch.py): SDPA's
flash kernel never materialises the scores. `SDPADotProductAttention` is the same module —
same constructor, parameters, state dict and `softmax_scale` (which rope_hook rescales for
YaRN) — whose forward calls SDPA for the case every run here uses: causal self-attention,
sq == sk, no dropout, vanilla softmax, no sliding window, and either no mask tensor or a boolean
[b|1, 1, s, s] mask in Megatron's convention (True = masked; document masking's block-diagonal
causal mask, which already holds the causal part, as Megatron's masked softmax expects). Any other
call goes to Megatron's own forward unchanged, and so do calls that need the probabilities as
a tensor (`materialized_probabilities`, for the attention-entropy metric). It is swapped in
through the ModuleSpec (`model.core_attention`, default sdpa for `transformer_impl=local`);
Transformer Engine's spec has its own fused attention and is not touched.

Sliding-window layers (model.window_size; megatron_ext.local_attention): the window is a banded causal mask
ANDed here with the caller's mask (document masking's block-diagonal one), so a local layer sees key j from query
i only when i - W <= j <= i and both lie in one document; SDPA then takes that mask (one [b|1, 1, s, s] boolean
tensor per microbatch and window, s² bytes: 256 MiB at s = 16K; FlexAttention is not used). Calls SDPA does not
cover (sinks, probabilities, dropout) go to Megatron's forward with the same combined mask. Attention sinks
(model.softmax_type) always take Megatron's unfused path, whose softmax appends the per-head sink logit
(scores materialised: [b, heads, sq, sk + 1]).

Private attributes reached (megatron-core 0.16.1, checked; Megatron-LM main at 00caa53 read): none beyond
DotProductAttention's public instance attributes set in its __init__ (softmax_scale, attn_mask_type, config,
num_attention_heads_per_partition, num_query_groups_per_partition, hidden_size_per_partition,
softmax_offset), and on sliding-window layers `scale_mask_softmax.window_size` (FusedScaleMaskSoftmax), set to
None: Megatron's torch softmax would otherwise replace the caller's mask by its own window mask (built on
"cuda"), dropping document masking; the window is in the mask passed instead.
"""

from __future__ import annotations

import contextlib
import copy
import weakref
from typing import Iterator

import torch
import torch.nn.functional as F
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.utils import is_layer_window_attention

from megatron_ext.local_attention import windowed_mask, zero_sinks


class SDPADotProductAttention(DotProductAttention):
    """DotProductAttention whose causal self-attention runs through torch SDPA (flash kernel on CPU)."""

    def __init__(self, config, layer_number: int, *args, **kwargs) -> None:
        rng_state = torch.random.get_rng_state()
        super().__init__(config, layer_number, *args, **kwargs)
        zero_sinks(self, rng_state)
        # Decided once: every reason to leave SDPA that does not depend on the call.
        self._sdpa_capable = not config.apply_query_key_layer_scaling and config.softmax_type == "vanilla"
        self.window: int | None = None
        if is_layer_window_attention(config.window_size, config.window_attn_skip_freq, layer_number):
            if tuple(config.window_size)[1] != 0 or not hasattr(self.scale_mask_softmax, "window_size"):
                raise ValueError(f"sliding window {config.window_size}: the SDPA core attention takes causal "
                                 "windows (W, 0) on a Megatron whose FusedScaleMaskSoftmax has window_size")
            self.window = int(config.window_size[0])
            self.scale_mask_softmax.window_size = None  # the window travels in the mask (module docstring)
        # Set by `materialized_probabilities`: the entropy metric hooks Megatron's
        # attention_dropout, which only the unfused path calls with the probabilities.
        self.materialize_probabilities = False

    def _uses_sdpa(self, query, key, attention_mask, attn_mask_type, attention_bias, packed_seq_params) -> bool:
        mask_type = self.attn_mask_type if attn_mask_type is None else attn_mask_type
        return (self._sdpa_capable and not self.materialize_probabilities
                and mask_type == AttnMaskType.causal and _sdpa_mask_ok(attention_mask, query.shape[0])
                and attention_bias is None and packed_seq_params is None
                and query.shape[0] == key.shape[0]
                and not (self.training and self.attention_dropout.p > 0))

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):
        """query [sq, b, np, hn], key/value [sk, b, ng, hn] → context [sq, b, np·hn]."""
        if self.window is not None:
            attention_mask = windowed_mask(attention_mask, query.shape[0], key.shape[0], self.window, query.device)
        if not self._uses_sdpa(query, key, attention_mask, attn_mask_type, attention_bias, packed_seq_params):
            return super().forward(query, key, value, attention_mask, attn_mask_type=attn_mask_type,
                                   attention_bias=attention_bias, packed_seq_params=packed_seq_params)
        sq, b = query.shape[:2]
        # [s, b, heads, d] → [b, heads, s, d]: SDPA's layout; GQA groups are expanded by SDPA itself.
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        # Megatron's mask marks what is hidden; SDPA's boolean mask marks what is seen.
        context = F.scaled_dot_product_attention(
            q, k, v, attn_mask=None if attention_mask is None else _visible(attention_mask),
            is_causal=attention_mask is None, scale=self.softmax_scale,
            enable_gqa=self.num_attention_heads_per_partition != self.num_query_groups_per_partition)
        return context.permute(2, 0, 1, 3).reshape(sq, b, self.hidden_size_per_partition)


_last_visible: tuple[weakref.ref, torch.Tensor] | None = None

def _visible(attention_mask: torch.Tensor) -> torch.Tensor:
    """~attention_mask, computed once per mask tensor: every layer of a microbatch gets the same mask object."""
    global _last_visible
    if _last_visible is None or _last_visible[0]() is not attention_mask:
        _last_visible = (weakref.ref(attention_mask), ~attention_mask)
    return _last_visible[1]


def _sdpa_mask_ok(attention_mask, seq_len: int) -> bool:
    """No mask, or a boolean [b|1, 1, s, s] one (shared by the heads) that SDPA can take as it is."""
    return attention_mask is None or (
        attention_mask.dtype == torch.bool and attention_mask.dim() == 4 and attention_mask.shape[1] == 1
        and tuple(attention_mask.shape[2:]) == (seq_len, seq_len))


@contextlib.contextmanager
def materialized_probabilities(model: torch.nn.Module) -> Iterator[None]:
    """Within the block, SDPA core attentions take Megatron's unfused path (probabilities exist as tensors)."""
    cores = [m for m in model.modules() if isinstance(m, SDPADotProductAttention)]
    for core in cores:
        core.materialize_probabilities = True
    try:
        yield
    finally:
        for core in cores:
            core.materialize_probabilities = False


def with_core_attention(spec: ModuleSpec, core_attention: str) -> ModuleSpec:
    """The local layer spec with its core attention chosen by `model.core_attention` (validated by ModelConfig)."""
    if core_attention == "megatron":
        return spec
    spec = copy.deepcopy(spec)
    spec.submodules.self_attention.submodules.core_attention = SDPADotProductAttention
    return spec


def sdpa_backend(config, seq_length: int, device: torch.device, masked: bool = False,
                 tensor_model_parallel_size: int = 1) -> str:
    """The kernel torch's SDPA picks for this model's attention shape: cudnn, flash, efficient or math.

    Asks torch's own dispatcher (`torch._fused_sdp_choice`, private; torch 2.13 checked) with one sample of
    the run's shape and dtype; batch size does not enter torch's choice. 'megatron' when SDPA is off."""
    if getattr(config, "core_attention", "sdpa") != "sdpa":
        return "megatron (model.core_attention=megatron)"
    heads, groups = config.num_attention_heads, config.num_query_groups or config.num_attention_heads
    head_dim = config.kv_channels or config.hidden_size // heads
    heads, groups = heads // tensor_model_parallel_size, max(groups // tensor_model_parallel_size, 1)
    dtype = torch.bfloat16 if config.bf16 else torch.float32
    q = torch.zeros(1, heads, seq_length, head_dim, dtype=dtype, device=device)
    k = torch.zeros(1, groups, seq_length, head_dim, dtype=dtype, device=device)
    mask = torch.ones(1, 1, seq_length, seq_length, dtype=torch.bool, device=device).tril() if masked else None
    try:
        choice = torch._fused_sdp_choice(q, k, k, attn_mask=mask, dropout_p=0.0, is_causal=mask is None,
                                         enable_gqa=groups != heads)
        return torch.nn.attention.SDPBackend(choice).name.lower().replace("_attention", "")
    except (AttributeError, RuntimeError, ValueError) as error:  # a torch without the private dispatcher entry
        return f"unknown ({type(error).__name__})"
