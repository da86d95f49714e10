"""The model's configuration, named like Megatron's TransformerConfig: the architecture, its checks and its sizes.

Knows nothing of Megatron (megatron_ext.model builds the model from it); the named sizes live in pretrain/table.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported by what computes frequencies, not by a config check
    import torch

TRANSFORMER_IMPLS = ("local", "transformer_engine")
FP8_FORMATS = (None, "e4m3", "hybrid")
FP8_RECIPES = ("delayed", "tensorwise", "mxfp8", "blockwise")
RECOMPUTE_GRANULARITIES = (None, "full", "selective")
RECOMPUTE_METHODS = (None, "uniform", "block")
# rope: RoPE at the sampler's positions; none: NoPE (Megatron's "none"); alibi: no RoPE, an
# attention bias -m_h·|p_i - p_j| from the same positions (megatron_ext.alibi).
POSITION_EMBEDDING_TYPES = ("rope", "none", "alibi")
CORE_ATTENTIONS = ("sdpa", "megatron")  # model.core_attention (megatron_ext.sdpa_attention)
ROPE_KERNELS = ("auto", "triton", "unfused")  # model.rope_kernel (megatron_ext.rope_attention)
# model.cross_entropy_fusion_impl: Megatron's two ('native', 'te') and ours (megatron_ext.chunked_loss)
CROSS_ENTROPY_FUSION_IMPLS = ("chunked", "native", "te")
SOFTMAX_TYPES = ("vanilla", "off-by-one", "learnable")  # Megatron's TransformerConfig.softmax_type (sinks)


@dataclass
class ModelConfig:
    """GPT model hyper-parameters; field names follow Megatron's TransformerConfig / arguments."""

    num_layers: int = 2
    hidden_size: int = 64
    ffn_hidden_size: int = 172
    num_attention_heads: int = 4
    num_query_groups: int | None = None  # None = num_attention_heads (no GQA)
    kv_channels: int | None = None  # None = hidden_size // num_attention_heads
    seq_length: int = 64  # the training window w
    vocab_size: int = 256  # the tokenizer's size; padded below for TP
    make_vocab_size_divisible_by: int = 128
    rotary_base: float = 10000.0
    rotary_interleaved: bool = False
    layernorm_epsilon: float = 1e-5
    init_method_std: float = 0.02
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0
    untie_embeddings_and_output_weights: bool = False
    transformer_impl: str = "local"  # local | transformer_engine
    bf16: bool = False
    fp8: str | None = None  # None | e4m3 | hybrid (Transformer Engine only)
    fp8_recipe: str = "delayed"
    use_cpu_initialization: bool = True  # same weights for every TP size with the same seed
    # Activation recomputation, as Megatron's --recompute-granularity/-method/-num-layers:
    # full recomputes whole layers (method + num_layers say which), selective only core attention.
    recompute_granularity: str | None = None  # None | full | selective
    recompute_method: str | None = None  # None | uniform | block (full only)
    recompute_num_layers: int | None = None  # layers per recompute unit (uniform) / per stage (block)
    position_embedding_type: str = "rope"  # rope | none (NoPE) | alibi
    # Core attention of the local layers (not a Megatron field: Megatron's local spec has one):
    # sdpa = torch's scaled_dot_product_attention (flash kernel, scores never materialised);
    # megatron = Megatron's DotProductAttention (baddbmm + masked softmax + bmm). Same math and
    # weights; sdpa falls back to megatron's path for calls it does not cover (megatron_ext.sdpa_attention).
    core_attention: str = "sdpa"
    # How q and k are rotated (not a Megatron field; Megatron's apply_rope_fusion is TE's kernel, set from
    # transformer_impl): triton = one fused Triton launch for q and k, any float positions (megatron_ext.kernels.rope);
    # unfused = Megatron's apply_rotary_pos_emb; auto = triton on CUDA, unfused on CPU (triton on CPU runs only
    # under TRITON_INTERPRET=1).
    rope_kernel: str = "auto"
    # Megatron's fused cross-entropy switch and implementation. chunked (ours, megatron_ext.chunked_loss): output
    # layer and loss in token chunks, no [tokens × vocab] logits tensor, logits recomputed in backward; native:
    # Megatron's jit-fused loss on full float32 logits (its gradients are cast to bf16: needs model.bf16); te:
    # Transformer Engine's. Off by default: chunked saves memory, not time (one more logits matmul).
    cross_entropy_loss_fusion: bool = False
    cross_entropy_fusion_impl: str = "chunked"
    # torch.compile each transformer layer (not a Megatron field): fewer kernel launches per step; same math
    # (pretrain.trainer.engine compiles the layers it builds; the first steps pay the compile time)
    compile: bool = False
    # Biases on the q/k/v projections only (Qwen2), as Megatron's TransformerConfig.add_qkv_bias.
    add_qkv_bias: bool = False
    # Llama 3.x RoPE scaling of the model's own frequencies (Megatron's --use-rope-scaling and
    # --rope-scaling-factor; the other three are the constants Megatron fixes, as HF's rope_scaling
    # names them). It is part of the model: training, evaluation and export all rotate by it.
    use_rope_scaling: bool = False
    rope_scaling_factor: float = 8.0
    rope_scaling_low_freq_factor: float = 1.0
    rope_scaling_high_freq_factor: float = 4.0
    rope_scaling_original_max_position_embeddings: int = 8192
    # Position options of 2025 models, each composable with any positions.strategy (rules and papers in
    # megatron_ext.positions.prope / nope_interleave / ssmax; Megatron wiring in megatron_ext.attention_scaling).
    rope_proportion: float = 1.0  # p-RoPE: keep the fastest ⌊p·d/2⌋ RoPE frequencies, zero the rest (1 = RoPE)
    no_rope_freq: int | None = None  # Megatron's: every N-th layer has no RoPE (Llama 4's iRoPE: 4)
    attn_temperature_tuning: bool = False  # Llama 4: NoPE layers' queries × 1 + β·log1p(⌊(i+1)/F⌋)
    attn_temperature_beta: float = 0.1  # β (transformers' attn_scale)
    attn_temperature_floor: int = 8192  # F (transformers' floor_scale)
    # SSMax: every logit × s·log n, n = keys the query sees (per document under document masking; not with
    # alibi or context parallelism); None = softmax
    ssmax_scale: float | None = None
    # Long-context recipes of production models, Megatron-Core's own options (rules and papers in
    # megatron_ext.local_attention). QK-norm (Qwen3, OLMo 2, Gemma 3): RMSNorm of each head's q and k before RoPE.
    qk_layernorm: bool = False
    # Sliding-window layers: query i sees keys i - W .. i (Megatron's window_size (W, 0); HF's sliding_window = W + 1)
    window_size: int | None = None
    # Every N-th layer global (full causal attention; Gemma 3: 6, i.e. 5 local : 1 global); None = all local
    window_attn_skip_freq: int | None = None
    # The local layers' RoPE base (Gemma 3: 10k local beside rotary_base 1M); None = rotary_base
    rotary_base_local: float | None = None
    # Attention sinks: learnable = a learned per-head logit s_h in every softmax denominator (gpt-oss);
    # off-by-one = s_h fixed at 0; vanilla = plain softmax
    softmax_type: str = "vanilla"

    def __post_init__(self) -> None:
        positive = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
                    "seq_length", "vocab_size", "make_vocab_size_divisible_by")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"model.{name} must be > 0 (got {getattr(self, name)})")
        if self.num_query_groups is None:
            self.num_query_groups = self.num_attention_heads
        if self.num_attention_heads % self.num_query_groups:
            raise ValueError(
                f"model.num_query_groups ({self.num_query_groups}) must divide "
                f"model.num_attention_heads ({self.num_attention_heads})")
        if self.kv_channels is None:
            if self.hidden_size % self.num_attention_heads:
                raise ValueError(
                    f"model.hidden_size ({self.hidden_size}) must be divisible by "
                    f"model.num_attention_heads ({self.num_attention_heads}), or set model.kv_channels")
            self.kv_channels = self.hidden_size // self.num_attention_heads
        if self.position_embedding_type not in POSITION_EMBEDDING_TYPES:
            raise ValueError(f"model.position_embedding_type must be one of {POSITION_EMBEDDING_TYPES} "
                             f"(got {self.position_embedding_type!r})")
        if self.kv_channels % 2 and self.position_embedding_type == "rope":
            raise ValueError(f"model.kv_channels must be even for RoPE (got {self.kv_channels})")
        if self.core_attention not in CORE_ATTENTIONS:
            raise ValueError(f"model.core_attention must be one of {CORE_ATTENTIONS} (got {self.core_attention!r})")
        if self.rope_kernel not in ROPE_KERNELS:
            raise ValueError(f"model.rope_kernel must be one of {ROPE_KERNELS} (got {self.rope_kernel!r})")
        self._check_cross_entropy()
        if self.rotary_base <= 1:
            raise ValueError(f"model.rotary_base must be > 1 (got {self.rotary_base})")
        if self.transformer_impl not in TRANSFORMER_IMPLS:
            raise ValueError(f"model.transformer_impl must be one of {TRANSFORMER_IMPLS} "
                             f"(got {self.transformer_impl!r})")
        if self.fp8 not in FP8_FORMATS:
            raise ValueError(f"model.fp8 must be one of {FP8_FORMATS} (got {self.fp8!r})")
        if self.fp8 is not None and self.transformer_impl != "transformer_engine":
            raise ValueError("model.fp8 needs model.transformer_impl=transformer_engine "
                             "(FP8 runs only through Transformer Engine)")
        if self.fp8_recipe not in FP8_RECIPES:
            raise ValueError(f"model.fp8_recipe must be one of {FP8_RECIPES} (got {self.fp8_recipe!r})")
        self._check_recompute()
        self._check_position_options()
        self._check_recipe_options()
        if self.use_rope_scaling:
            if self.position_embedding_type != "rope":
                raise ValueError("model.use_rope_scaling (Llama 3 RoPE scaling) needs "
                                 "model.position_embedding_type=rope")
            self.rope_scaling()  # validates the factors

    def _check_position_options(self) -> None:
        """p-RoPE, NoPE-interleave, temperature and SSMax settings (ValueError naming the field and the fix)."""
        from megatron_ext.positions import kept_frequencies, nope_layers

        rope = self.position_embedding_type == "rope"
        kept_frequencies(self.kv_channels, self.rope_proportion)  # validates the range
        if self.rope_proportion < 1.0 and (not rope or self.use_rope_scaling):
            raise ValueError("model.rope_proportion < 1 (p-RoPE) needs model.position_embedding_type=rope "
                             "without model.use_rope_scaling")
        if self.no_rope_freq is not None:
            if not rope:
                raise ValueError("model.no_rope_freq (NoPE-interleaved layers) needs model.position_embedding_type"
                                 "=rope; for NoPE everywhere use position_embedding_type=none")
            nope_layers(self.num_layers, self.no_rope_freq)  # validates it
        if self.attn_temperature_tuning and self.no_rope_freq is None:
            raise ValueError("model.attn_temperature_tuning scales the NoPE layers' queries: set model.no_rope_freq")
        if self.attn_temperature_beta < 0 or self.attn_temperature_floor < 1:
            raise ValueError(f"model.attn_temperature_beta must be >= 0 and model.attn_temperature_floor >= 1 "
                             f"(got {self.attn_temperature_beta} and {self.attn_temperature_floor})")
        if self.ssmax_scale is not None and not self.ssmax_scale > 0:
            raise ValueError(f"model.ssmax_scale must be > 0 or null (got {self.ssmax_scale})")
        if self.ssmax_scale is not None and self.position_embedding_type == "alibi":
            # The query scaling multiplies q·k only; ALiBi's bias is added after it, so SSMax would miss it.
            raise ValueError("model.ssmax_scale (SSMax) with model.position_embedding_type=alibi is not supported "
                             "(SSMax would scale q·k but not ALiBi's bias); use rope or none with SSMax")

    def _check_recipe_options(self) -> None:
        """Sliding windows, per-kind RoPE base and sinks (ValueError naming the field and the fix)."""
        if self.softmax_type not in SOFTMAX_TYPES:
            raise ValueError(f"model.softmax_type must be one of {SOFTMAX_TYPES} (got {self.softmax_type!r})")
        if self.softmax_type == "learnable" and self.transformer_impl == "local" and self.core_attention != "sdpa" \
                and self.position_embedding_type != "alibi":
            raise ValueError("model.softmax_type=learnable needs model.core_attention=sdpa (Megatron's own class "
                             "draws the sinks per TP rank, so the initial weights would depend on the TP size)")
        if self.window_size is None:
            for name in ("window_attn_skip_freq", "rotary_base_local"):
                if getattr(self, name) is not None:
                    raise ValueError(f"model.{name} applies to sliding-window layers: set model.window_size or "
                                     f"drop model.{name}")
            return
        if self.window_size < 1:
            raise ValueError(f"model.window_size must be >= 1 keys before the query, or null (got {self.window_size})")
        if self.window_attn_skip_freq is not None and self.window_attn_skip_freq < 1:
            raise ValueError(f"model.window_attn_skip_freq must be >= 1 (every N-th layer global) or null "
                             f"(got {self.window_attn_skip_freq})")
        if self.position_embedding_type == "alibi":
            raise ValueError("model.window_size with model.position_embedding_type=alibi is not supported (the ALiBi "
                             "core attention is Megatron's, whose window mask replaces the document mask): use rope")
        if self.transformer_impl == "local" and self.core_attention != "sdpa":
            raise ValueError("model.window_size needs model.core_attention=sdpa with transformer_impl=local "
                             "(Megatron's unfused attention replaces the document mask by its window mask)")
        if self.rotary_base_local is not None:
            if self.position_embedding_type != "rope" or self.rope_proportion < 1.0 or self.use_rope_scaling:
                raise ValueError("model.rotary_base_local needs model.position_embedding_type=rope without p-RoPE "
                                 "(model.rope_proportion < 1) or model.use_rope_scaling")
            if self.rotary_base_local <= 1:
                raise ValueError(f"model.rotary_base_local must be > 1 (got {self.rotary_base_local})")

    def local_layers(self) -> list[bool]:
        """Per layer (index 0 = layer 1): True for a sliding-window layer (Megatron's is_layer_window_attention)."""
        if self.window_size is None:
            return [False] * self.num_layers
        if self.window_attn_skip_freq is None:
            return [True] * self.num_layers
        return [(layer + 1) % self.window_attn_skip_freq != 0 for layer in range(self.num_layers)]

    def global_rope_layers(self) -> list[bool] | None:
        """Per layer: True for a full-attention layer with RoPE (what positions.layer_mode=global scales); None
        without sliding-window layers."""
        from megatron_ext.positions import nope_layers

        if self.window_size is None:
            return None
        nope = (nope_layers(self.num_layers, self.no_rope_freq) if self.no_rope_freq is not None
                else [self.position_embedding_type != "rope"] * self.num_layers)
        return [not local and not no for local, no in zip(self.local_layers(), nope)]

    def local_inv_freq(self, device: torch.device | str | None = None) -> torch.Tensor | None:
        """The local layers' RoPE inverse frequencies (model.rotary_base_local), None when they share rotary_base."""
        from megatron_ext.positions import rope_inv_freq

        if self.rotary_base_local is None:
            return None
        return rope_inv_freq(self.rotary_dim, self.rotary_base_local, device)

    @property
    def scales_queries(self) -> bool:
        """True when queries get a per-token factor (attention temperature or SSMax)."""
        return self.attn_temperature_tuning or self.ssmax_scale is not None

    def rope_scaling(self):
        """The model's own RoPE scaling (megatron_ext.positions.RopeScaling 'llama3'), None without one."""
        from megatron_ext.positions import RopeScaling

        if not self.use_rope_scaling:
            return None
        try:
            return RopeScaling(kind="llama3", factor=float(self.rope_scaling_factor),
                               original_max_position_embeddings=int(self.rope_scaling_original_max_position_embeddings),
                               low_freq_factor=float(self.rope_scaling_low_freq_factor),
                               high_freq_factor=float(self.rope_scaling_high_freq_factor))
        except ValueError as error:
            raise ValueError(f"model.use_rope_scaling: {error} (model.rope_scaling_* fields)") from None

    def inv_freq(self, device: torch.device | str | None = None) -> torch.Tensor:
        """The model's RoPE inverse frequencies [rotary_dim // 2] (Llama 3 scaled with use_rope_scaling)."""
        from megatron_ext.positions import prope_inv_freq, rope_inv_freq, scaled_inv_freq

        scaling = self.rope_scaling()
        if self.rope_proportion < 1.0:
            return prope_inv_freq(self.rotary_dim, self.rotary_base, self.rope_proportion, device)
        if scaling is None:
            return rope_inv_freq(self.rotary_dim, self.rotary_base, device)
        return scaled_inv_freq(self.rotary_dim, self.rotary_base, scaling, self.seq_length, device)[0]

    def check_positions(self, strategy: str, rope_scaling: str | None, layer_mode: str = "all") -> None:
        """Refuse position settings that would drop the model's own Llama 3 scaling or local RoPE base, or that scale
        no layer (ValueError naming them)."""
        if strategy == "drope" and self.position_embedding_type != "rope":
            raise ValueError(f"positions.strategy=drope pretrains with RoPE and then drops it, but "
                             f"model.position_embedding_type={self.position_embedding_type}: use rope")
        if strategy == "drope" and self.window_size is not None:
            raise ValueError("positions.strategy=drope drops the positional embeddings of full-attention models (the "
                             "DroPE paper's recipe; it compares sliding-window hybrids as another architecture): drop "
                             "model.window_size")
        if layer_mode == "global" and not any(self.global_rope_layers() or []):
            raise ValueError("positions.layer_mode=global scales the full-attention RoPE layers of a model with "
                             "sliding-window layers: set model.window_size and model.window_attn_skip_freq with a "
                             "global RoPE layer (model.no_rope_freq makes them NoPE), or use layer_mode=all")
        # random_base and ryarn (YaRN's) hand the hook their own frequencies, as an inference rope scaling does.
        replaces = strategy in ("random_base", "ryarn") or rope_scaling not in (None, "none")
        if self.rotary_base_local is not None and replaces:
            raise ValueError(f"positions.strategy={strategy} / rope scaling {rope_scaling!r} would replace the RoPE "
                             "frequencies of every layer, local ones (model.rotary_base_local) included: drop it")
        if self.rope_proportion < 1.0 and replaces:
            raise ValueError(f"positions.strategy={strategy} / rope scaling {rope_scaling!r} would rebuild plain "
                             "RoPE frequencies and drop p-RoPE's (model.rope_proportion < 1): drop it")
        if not self.use_rope_scaling:
            return
        if strategy in ("random_base", "ryarn"):
            raise ValueError(f"positions.strategy={strategy} builds its own RoPE frequencies, which would drop the "
                             "model's Llama 3 RoPE scaling (model.use_rope_scaling); use posaug, rfs, rpe or warp")
        if rope_scaling not in (None, "none"):
            raise ValueError(f"rope scaling {rope_scaling!r} cannot be added to the model's own Llama 3 RoPE scaling "
                             "(model.use_rope_scaling; an HF config holds one rope type): drop it")

    def _check_cross_entropy(self) -> None:
        """model.cross_entropy_* (ValueError naming the field and the fix)."""
        if self.cross_entropy_fusion_impl not in CROSS_ENTROPY_FUSION_IMPLS:
            raise ValueError(f"model.cross_entropy_fusion_impl must be one of {CROSS_ENTROPY_FUSION_IMPLS} "
                             f"(got {self.cross_entropy_fusion_impl!r})")
        if not self.cross_entropy_loss_fusion:
            return
        if self.cross_entropy_fusion_impl == "native" and not self.bf16:
            raise ValueError("model.cross_entropy_fusion_impl=native casts the logits' gradients to bf16, which a "
                             "float32 model would silently lose: set model.bf16=true or use chunked")
        if self.cross_entropy_fusion_impl == "te" and self.transformer_impl != "transformer_engine":
            raise ValueError("model.cross_entropy_fusion_impl=te needs model.transformer_impl=transformer_engine; "
                             "use chunked or native")

    def _check_recompute(self) -> None:
        """Megatron's TransformerConfig rules for recompute_*, raised before any model is built."""
        if self.recompute_granularity not in RECOMPUTE_GRANULARITIES:
            raise ValueError(f"model.recompute_granularity must be null, full or selective "
                             f"(got {self.recompute_granularity!r})")
        if self.recompute_method not in RECOMPUTE_METHODS:
            raise ValueError(f"model.recompute_method must be null, uniform or block (got {self.recompute_method!r})")
        if self.recompute_granularity == "full":
            if self.recompute_method is None or self.recompute_num_layers is None:
                raise ValueError("model.recompute_granularity=full needs model.recompute_method (uniform or block) "
                                 "and model.recompute_num_layers (e.g. uniform with 1 recomputes every layer)")
            if self.recompute_num_layers < 1:
                raise ValueError(f"model.recompute_num_layers must be >= 1 (got {self.recompute_num_layers})")
        elif self.recompute_method is not None or self.recompute_num_layers is not None:
            raise ValueError("model.recompute_method and model.recompute_num_layers apply only to "
                             "model.recompute_granularity=full; remove them or set the granularity to full")

    @property
    def rotary_dim(self) -> int:
        """Number of rotated channels per head (Megatron's rotary_percent is 1.0 here)."""
        return self.kv_channels

    def padded_vocab_size(self, tensor_model_parallel_size: int = 1) -> int:
        """Vocabulary padded to a multiple of make_vocab_size_divisible_by × TP, as Megatron does."""
        multiple = self.make_vocab_size_divisible_by * tensor_model_parallel_size
        return -(-self.vocab_size // multiple) * multiple

    def non_embedding_parameters(self) -> int:
        """Parameters outside the (tied) embedding: what the PosAug paper's Table 1 counts."""
        h, f, d = self.hidden_size, self.ffn_hidden_size, self.kv_channels
        q, kv = self.num_attention_heads * d, self.num_query_groups * d
        attention = h * (q + 2 * kv) + q * h + (q + 2 * kv if self.add_qkv_bias else 0)
        attention += (2 * d if self.qk_layernorm else 0) + (self.num_attention_heads
                                                            if self.softmax_type == "learnable" else 0)
        mlp = h * 2 * f + f * h  # SwiGLU: gate and up in fc1, down in fc2
        norms = 2 * h
        return self.num_layers * (attention + mlp + norms) + h  # + final norm

    def total_parameters(self, tensor_model_parallel_size: int = 1) -> int:
        """All parameters, with the padded vocabulary (one embedding copy unless untied)."""
        embedding = self.padded_vocab_size(tensor_model_parallel_size) * self.hidden_size
        copies = 2 if self.untie_embeddings_and_output_weights else 1
        return self.non_embedding_parameters() + copies * embedding

    def flops_per_token(self, causal_attention_once: bool = False) -> float:
        """Training FLOPs per token by FLOP_CONVENTION (the one count of plan, the trainer's MFU and the benchmarks)."""
        n = self.non_embedding_parameters() + self.padded_vocab_size() * self.hidden_size
        attention = 12 * self.num_layers * self.num_attention_heads * self.kv_channels * self.seq_length
        return 6 * n + (attention / 2 if causal_attention_once else attention)


# The project's one FLOP count: plan's step time, the trainer's MFU, selfcheck and the benchmarks all call
# ModelConfig.flops_per_token and model_flops_utilization. PaLM's count (Chowdhery et al. 2022, appendix B) is
# Megatron-LM's too (Narayanan et al. 2021, appendix): attention's two matmuls counted over the whole s x s score
# matrix although a causal mask leaves half of it, so Megatron's published MFU and ours are on the same count.
# Counting causal attention once (what a causal flash kernel computes) gives a lower MFU; the benchmarks show it
# beside, named as such (flops_per_token(causal_attention_once=True)).
FLOP_CONVENTION = ("PaLM's count: 6N + 12·L·heads·d·s per token (N incl. the output layer; causal attention "
                   "counted in full, as Megatron's published MFU is)")


def model_flops_utilization(flops_per_token: float, tokens_per_s: float, peak_tflops: float,
                            devices: int = 1) -> float:
    """The fraction of `devices` x `peak_tflops` that `tokens_per_s` at `flops_per_token` uses."""
    return tokens_per_s * flops_per_token / (peak_tflops * 1e12 * devices)
