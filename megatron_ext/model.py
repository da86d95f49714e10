"""The Megatron model builder: TransformerConfig, layer specs and the GPTModel for a ModelConfig.

The configuration itself (named like Megatron's TransformerConfig) lives in megatron_ext/model_config.py; the named
sizes (Table 1 and CPU models) in pretrain/table.py.

The architecture is the PosAug paper's: decoder-only, SwiGLU, RMSNorm, GQA, tied
embeddings, RoPE (base 10000 by default, non-interleaved so it equals HF Llama's). Imported
models add what their architecture needs of Megatron's: q/k/v biases (Qwen2, add_qkv_bias) and
Llama 3's RoPE scaling (use_rope_scaling). Position options of 2025 models: p-RoPE (rope_proportion),
NoPE-interleaved layers with Llama 4's attention temperature (no_rope_freq, attn_temperature_*) and SSMax
(ssmax_scale). Long-context recipes (megatron_ext.local_attention): QK-norm (qk_layernorm), sliding-window
layers beside global ones with a per-kind RoPE base (window_size, window_attn_skip_freq, rotary_base_local) and
attention sinks (softmax_type). The layout (`parallel.*`) lives in megatron_ext.parallel.
"""

from __future__ import annotations

# Reaches into Megatron-Core (checked against megatron-core 0.16.1, 0.17.1, 0.18.2 and 0.19.2; build_model logs
# one line per reach of megatron_ext.versions the installed Megatron lacks):
# - RotaryEmbedding.inv_freq (a plain attribute of GPTModel.rotary_pos_emb) is replaced by p-RoPE's
#   (model.rope_proportion < 1) or by the Llama-3-scaled frequencies with model.use_rope_scaling: Megatron's own rope_scaling hard-codes
#   the original window 8192 and the low/high frequency factors 1 and 4, which HF reads from config.

import logging
from typing import Callable

import torch

from megatron_ext.model_config import ModelConfig
from megatron_ext.parallel import ParallelConfig

log = logging.getLogger(__name__)


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
        # chunked is ours (megatron_ext.chunked_loss): Megatron's own loss path stays unfused under it
        cross_entropy_loss_fusion=model.cross_entropy_loss_fusion and model.cross_entropy_fusion_impl != "chunked",
        cross_entropy_fusion_impl="te" if model.cross_entropy_fusion_impl == "te" else "native",
        # Megatron's list form (1 = no RoPE): its integer form also demands that N divide num_layers.
        no_rope_freq=(None if model.no_rope_freq is None
                      else [int(n) for n in nope_layers(model.num_layers, model.no_rope_freq)]),
        # Long-context recipes (megatron_ext.local_attention): Megatron's own fields.
        qk_layernorm=model.qk_layernorm,
        window_size=None if model.window_size is None else (int(model.window_size), 0),
        window_attn_skip_freq=model.window_attn_skip_freq,
        softmax_type=model.softmax_type,
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
    from megatron_ext.rope_attention import chosen_rope_kernel, rope_paths_line, with_fused_rope

    rope_kernel = chosen_rope_kernel(model.rope_kernel, rope=model.position_embedding_type == "rope")
    spec_kwargs = {} if model.transformer_impl == "transformer_engine" else {"normalization": "RMSNorm"}
    spec_kwargs["qk_layernorm"] = model.qk_layernorm
    if model.position_embedding_type == "alibi":  # context parallelism refused by parallel.check_model
        from megatron_ext.alibi_attention import alibi_layer_spec

        spec = alibi_layer_spec(model.transformer_impl, **spec_kwargs)
    else:
        spec = layer_spec_function(model)(**spec_kwargs)
        if model.transformer_impl == "local":
            from megatron_ext.sdpa_attention import with_core_attention

            spec = with_core_attention(spec, model.core_attention)
        if rope_kernel == "triton":
            spec = with_fused_rope(spec)
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
    if model.position_embedding_type == "rope":  # the trainer prints it at start-up
        gpt.rope_paths = rope_paths_line(config, rope_kernel, te=model.transformer_impl == "transformer_engine",
                                         per_sample_positions=per_sample_positions)
        log.info(gpt.rope_paths)
    if model.cross_entropy_loss_fusion and model.cross_entropy_fusion_impl == "chunked":
        from megatron_ext.chunked_loss import install_chunked_loss

        install_chunked_loss(gpt)
    if model.use_rope_scaling or model.rope_proportion < 1.0:
        # Megatron's own rope_scaling fixes the original window at 8192 (HF's llama3 takes it from the
        # config); p-RoPE zeroes frequencies Megatron has no option for.
        rotary = gpt.rotary_pos_emb
        rotary.inv_freq = model.inv_freq(rotary.inv_freq.device)
    if model.softmax_type == "learnable":
        from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes

        # Megatron shards the sinks by head (its sharded_state_dict splits them on dim 0) but does not mark them:
        # marked, gradient norms count every TP rank's sinks, not rank 0's alone.
        for layer in gpt.decoder.layers:
            set_tensor_model_parallel_attributes(layer.self_attention.core_attention.softmax_offset, True, 0, 1)
    if model.rotary_base_local is not None:
        gpt.set_local_rope(model.local_inv_freq(gpt.rotary_pos_emb.inv_freq.device), model.local_layers())
    if model.scales_queries:  # context parallelism refused by parallel.check_model
        from megatron_ext.attention_scaling import install_query_scaling

        temperature = ((model.attn_temperature_beta, float(model.attn_temperature_floor))
                       if model.attn_temperature_tuning else None)
        install_query_scaling(gpt, temperature=temperature, ssmax_scale=model.ssmax_scale,
                              windows=[model.window_size if local else None for local in model.local_layers()])
    if model.bf16:
        # The local spec builds torch norms in float32 (TE builds them in params_dtype): cast every
        # parameter as Megatron's Float16Module does. Float16Module itself is not used: it would also
        # cast the float positions a caller passes to bf16 (position 16384 would move by up to 64).
        # Buffers (ALiBi slopes) and inv_freq (an attribute) stay float32, and so do the angles.
        for param in gpt.parameters():
            if param.is_floating_point() and param.dtype != torch.bfloat16:
                param.data = param.data.to(torch.bfloat16)
    return gpt
