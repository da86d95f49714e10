"""Model configuration (named like Megatron's TransformerConfig) and the Megatron model builder.

The named sizes (Table 1 and CPU models) live in pretrain/table.py.

The architecture is the PosAug paper's: decoder-only, SwiGLU, RMSNorm, GQA, tied
embeddings, RoPE (base 10000 by default, non-interleaved so it equals HF Llama's). Imported
models add what their architecture needs of Megatron's: q/k/v biases (Qwen2, add_qkv_bias) and
Llama 3's RoPE scaling (use_rope_scaling). Position options of 2025 models: p-RoPE (rope_proportion),
NoPE-interleaved layers with Llama 4's attention temperature (no_rope_freq, attn_temperature_*) and SSMax
(ssmax_scale). The layout (`parallel.*`) lives in megatron_ext.parallel.
"""

from __future__ import annotations

# Reaches into Megatron-Core (checked against megatron-core 0.16.1, 0.17.1, 0.18.2 and 0.19.2; build_model logs
# one line per reach of megatron_ext.versions the installed Megatron lacks):
# - RotaryEmbedding.inv_freq (a plain attribute of GPTModel.rotary_pos_emb) is replaced by p-RoPE's
#   (model.rope_proportion < 1) or by the Llama-3-scaled frequencies with model.use_rope_scaling: Megatron's own rope_scaling hard-codes
#   the original window 8192 and the low/high frequency factors 1 and 4, which HF reads from config.

import dataclasses
import logging
from dataclasses import dataclass
from typing import Callable

import torch

from megatron_ext.parallel import ParallelConfig

log = logging.getLogger(__name__)

TRANSFORMER_IMPLS = ("local", "transformer_engine")
FP8_FORMATS = (None, "e4m3", "hybrid")
FP8_RECIPES = ("delayed", "tensorwise", "mxfp8", "blockwise")
RECOMPUTE_GRANULARITIES = (None, "full", "selective")
RECOMPUTE_METHODS = (None, "uniform", "block")
# rope: RoPE at the sampler's positions; none: NoPE (Megatron's "none"); alibi: no RoPE, an
# attention bias -m_h·|p_i - p_j| from the same positions (megatron_ext.alibi).
POSITION_EMBEDDING_TYPES = ("rope", "none", "alibi")
CORE_ATTENTIONS = ("sdpa", "megatron")  # model.core_attention (megatron_ext.sdpa_attention)


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
    ssmax_scale: float | None = None  # SSMax: every logit × s·log n, n = keys the query sees; None = softmax

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

    def check_positions(self, strategy: str, rope_scaling: str | None) -> None:
        """Refuse position settings that would drop the model's own Llama 3 scaling (ValueError naming them)."""
        if self.rope_proportion < 1.0 and (strategy == "random_base" or rope_scaling not in (None, "none")):
            raise ValueError(f"positions.strategy={strategy} / rope scaling {rope_scaling!r} would rebuild plain "
                             "RoPE frequencies and drop p-RoPE's (model.rope_proportion < 1): drop it")
        if not self.use_rope_scaling:
            return
        if strategy == "random_base":
            raise ValueError("positions.strategy=random_base draws plain RoPE frequencies, which would drop the "
                             "model's Llama 3 RoPE scaling (model.use_rope_scaling); use posaug, rfs, rpe or warp")
        if rope_scaling not in (None, "none"):
            raise ValueError(f"rope scaling {rope_scaling!r} cannot be added to the model's own Llama 3 RoPE scaling "
                             "(model.use_rope_scaling; an HF config holds one rope type): drop it")

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
        mlp = h * 2 * f + f * h  # SwiGLU: gate and up in fc1, down in fc2
        norms = 2 * h
        return self.num_layers * (attention + mlp + norms) + h  # + final norm

    def total_parameters(self, tensor_model_parallel_size: int = 1) -> int:
        """All parameters, with the padded vocabulary (one embedding copy unless untied)."""
        embedding = self.padded_vocab_size(tensor_model_parallel_size) * self.hidden_size
        copies = 2 if self.untie_embeddings_and_output_weights else 1
        return self.non_embedding_parameters() + copies * embedding

    def flops_per_token(self) -> float:
        """Training FLOPs per token (6N + attention), for the MFU estimate."""
        n = self.non_embedding_parameters() + self.padded_vocab_size() * self.hidden_size
        attention = 12 * self.num_layers * self.num_attention_heads * self.kv_channels * self.seq_length
        return 6 * n + attention


def transformer_config(model: ModelConfig, parallel: ParallelConfig | None = None,
                       *, per_sample_positions: bool = False):
    """Megatron TransformerConfig for this model and layout (fusions only where kernels exist)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    from megatron_ext.positions import nope_layers

    parallel = parallel or ParallelConfig()
    te = model.transformer_impl == "transformer_engine"
    on_gpu = torch.cuda.is_available()
    dtype = torch.bfloat16 if model.bf16 else torch.float32
    # TE's fused RoPE takes one frequency row per position; per-sample positions [b, s]
    # need the unfused kernel, which broadcasts [s, b, 1, d] frequencies.
    rope_fusion = te and on_gpu and not per_sample_positions and model.position_embedding_type == "rope"
    if te and per_sample_positions:
        log.info("per-sample positions: using Megatron's unfused RoPE (TE fused RoPE needs [s] positions)")
    config = TransformerConfig(
        num_layers=model.num_layers,
        hidden_size=model.hidden_size,
        ffn_hidden_size=model.ffn_hidden_size,
        num_attention_heads=model.num_attention_heads,
        num_query_groups=model.num_query_groups,
        kv_channels=model.kv_channels,
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        normalization="RMSNorm",
        layernorm_epsilon=model.layernorm_epsilon,
        add_bias_linear=False,
        add_qkv_bias=model.add_qkv_bias,
        hidden_dropout=model.hidden_dropout,
        attention_dropout=model.attention_dropout,
        init_method_std=model.init_method_std,
        rotary_interleaved=model.rotary_interleaved,
        tensor_model_parallel_size=parallel.tensor_model_parallel_size,
        pipeline_model_parallel_size=parallel.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=parallel.virtual_pipeline_model_parallel_size,
        # Megatron-LM's own setting for interleaving (overlap_p2p_comm, no batched p2p). Batched p2p
        # gave wrong activations with PP=2 × VP=2 on gloo, where both neighbours are the same rank.
        overlap_p2p_comm=parallel.virtual_pipeline_model_parallel_size is not None,
        batch_p2p_comm=parallel.virtual_pipeline_model_parallel_size is None,
        context_parallel_size=parallel.context_parallel_size,
        sequence_parallel=parallel.sequence_parallel,
        recompute_granularity=model.recompute_granularity,
        recompute_method=model.recompute_method,
        recompute_num_layers=model.recompute_num_layers,
        use_cpu_initialization=model.use_cpu_initialization,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=model.bf16,
        fp8=model.fp8,
        fp8_recipe=model.fp8_recipe,
        apply_rope_fusion=rope_fusion,
        # Megatron's list form (1 = no RoPE): its integer form also demands that N divide num_layers.
        no_rope_freq=(None if model.no_rope_freq is None
                      else [int(n) for n in nope_layers(model.num_layers, model.no_rope_freq)]),
        bias_activation_fusion=on_gpu,
        bias_dropout_fusion=on_gpu,
        masked_softmax_fusion=te and on_gpu,
        persist_layer_norm=False,
        gradient_accumulation_fusion=te and on_gpu,
    )
    return config


def layer_spec_function(model: ModelConfig) -> Callable:
    """Megatron's layer-spec factory for the chosen implementation (TE imported lazily)."""
    from megatron.core.models.gpt import gpt_layer_specs

    if model.transformer_impl == "transformer_engine":
        return gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec
    return gpt_layer_specs.get_gpt_layer_local_spec


def check_runtime(model: ModelConfig) -> None:
    """Refuse Transformer Engine / FP8 / BF16 where they cannot run, naming the fix."""
    if model.transformer_impl == "transformer_engine":
        if not torch.cuda.is_available():
            raise RuntimeError(
                "model.transformer_impl=transformer_engine needs a CUDA GPU and the `gpu` extra "
                "(pip install '.[gpu]'); on CPU use model.transformer_impl=local")
        try:
            import transformer_engine  # noqa: F401
        except ImportError as error:
            raise RuntimeError("model.transformer_impl=transformer_engine but transformer_engine "
                               "is not installed: pip install '.[gpu]'") from error


def build_model(model: ModelConfig, parallel: ParallelConfig | None = None, *,
                pre_process: bool = True, post_process: bool = True,
                per_sample_positions: bool = False, vp_stage: int | None = None):
    """A FloatPositionGPTModel (this rank's pipeline stage, or its virtual stage vp_stage); parallel state must exist."""
    from megatron_ext.rope_hook import FloatPositionGPTModel

    parallel = parallel or ParallelConfig()
    parallel.check_model(model)
    check_runtime(model)
    config = transformer_config(model, parallel, per_sample_positions=per_sample_positions)
    spec_kwargs = {} if model.transformer_impl == "transformer_engine" else {"normalization": "RMSNorm"}
    if model.position_embedding_type == "alibi":
        if parallel.context_parallel_size > 1:
            raise ValueError("model.position_embedding_type=alibi does not support context parallelism; "
                             "set parallel.context_parallel_size=1")
        from megatron_ext.alibi_attention import alibi_layer_spec

        spec = alibi_layer_spec(model.transformer_impl, **spec_kwargs)
    else:
        spec = layer_spec_function(model)(**spec_kwargs)
        if model.transformer_impl == "local":
            from megatron_ext.sdpa_attention import with_core_attention

            spec = with_core_attention(spec, model.core_attention)
    gpt = FloatPositionGPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=model.padded_vocab_size(parallel.tensor_model_parallel_size),
        max_sequence_length=model.seq_length,
        pre_process=pre_process,
        post_process=post_process,
        share_embeddings_and_output_weights=not model.untie_embeddings_and_output_weights,
        position_embedding_type="rope" if model.position_embedding_type == "rope" else "none",
        alibi=model.position_embedding_type == "alibi",
        rotary_base=int(model.rotary_base) if float(model.rotary_base).is_integer() else model.rotary_base,
        vp_stage=vp_stage,
    )
    from megatron_ext.versions import log_missing_reaches

    log_missing_reaches(gpt)
    if model.use_rope_scaling or model.rope_proportion < 1.0:
        # Megatron's own rope_scaling fixes the original window at 8192 (HF's llama3 takes it from the
        # config); p-RoPE zeroes frequencies Megatron has no option for.
        rotary = gpt.rotary_pos_emb
        rotary.inv_freq = model.inv_freq(rotary.inv_freq.device)
    if model.scales_queries:
        if parallel.context_parallel_size > 1:
            raise ValueError("model.attn_temperature_tuning / model.ssmax_scale scale queries by their token index, "
                             "which a context-parallel rank does not hold: set parallel.context_parallel_size=1")
        from megatron_ext.attention_scaling import install_query_scaling

        temperature = ((model.attn_temperature_beta, float(model.attn_temperature_floor))
                       if model.attn_temperature_tuning else None)
        install_query_scaling(gpt, temperature=temperature, ssmax_scale=model.ssmax_scale)
    if model.bf16:
        # The local spec builds torch norms in float32 (TE builds them in params_dtype): cast every
        # parameter as Megatron's Float16Module does. Float16Module itself is not used: it would also
        # cast the float positions a caller passes to bf16 (position 16384 would move by up to 64).
        # Buffers (ALiBi slopes) and inv_freq (an attribute) stay float32, and so do the angles.
        for param in gpt.parameters():
            if param.is_floating_point() and param.dtype != torch.bfloat16:
                param.data = param.data.to(torch.bfloat16)
    return gpt


def model_config_dict(model: ModelConfig) -> dict:
    """Plain dict of the config, for saving beside checkpoints."""
    return dataclasses.asdict(model)
