"""Model-parallel layout (`parallel.*`, named like Megatron's arguments) and its checks against a model."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ParallelConfig:
    """Model-parallel layout; names follow Megatron's arguments."""

    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    context_parallel_size: int = 1
    sequence_parallel: bool = False
    use_distributed_optimizer: bool = False
    # Megatron DDP: all-reduce / reduce-scatter grads bucket by bucket during the backward pass,
    # and all-gather updated params during the next forward (distributed optimizer only).
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    # Interleaved 1F1B: model chunks per pipeline rank (None = one chunk, plain 1F1B).
    virtual_pipeline_model_parallel_size: int | None = None
    # Hang timeouts (pretrain/trainer/watchdog.py). Start-up, checkpoint load, the first step, checkpoint
    # saves and validation may take this long (Megatron-LM's --distributed-timeout-minutes, NCCL's default 10)...
    distributed_timeout_minutes: int = 10
    # ...every later training step this long: then the watchdog writes every rank's stacks, names the silent
    # rank and ends the job. 2 minutes: far above a step of the shipped configs on their GPUs (`pretrain plan`:
    # 0.15 s for 1B on 8 H100s) and of the CPU presets on a loaded machine (seconds), so a hung 32-GPU job burns
    # about 1 GPU-hour instead of the 5 of NCCL's 10-minute default.
    train_timeout_seconds: float = 120.0

    def __post_init__(self) -> None:
        for name in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"parallel.{name} must be >= 1 (got {getattr(self, name)})")
        # Megatron's arguments.py rules for --overlap-param-gather.
        if self.overlap_param_gather and not self.use_distributed_optimizer:
            raise ValueError("parallel.overlap_param_gather=true needs parallel.use_distributed_optimizer=true "
                             "(only the distributed optimizer all-gathers params)")
        if self.overlap_param_gather and not self.overlap_grad_reduce:
            raise ValueError("parallel.overlap_param_gather=true needs parallel.overlap_grad_reduce=true "
                             "(Megatron overlaps the param all-gather only together with the grad reduction)")
        if self.distributed_timeout_minutes < 1 or self.train_timeout_seconds <= 0:
            raise ValueError(f"parallel.distributed_timeout_minutes must be >= 1 and parallel.train_timeout_seconds "
                             f"> 0 (got {self.distributed_timeout_minutes} and {self.train_timeout_seconds})")
        vp = self.virtual_pipeline_model_parallel_size
        if vp is not None:
            if vp < 1:
                raise ValueError(f"parallel.virtual_pipeline_model_parallel_size must be >= 1 or null (got {vp})")
            if vp > 1 and self.pipeline_model_parallel_size == 1:
                raise ValueError("parallel.virtual_pipeline_model_parallel_size > 1 needs "
                                 "parallel.pipeline_model_parallel_size > 1 (interleaving splits pipeline stages)")
            if vp == 1:
                self.virtual_pipeline_model_parallel_size = None  # one chunk is plain 1F1B
        if self.sequence_parallel and self.tensor_model_parallel_size == 1:
            self.sequence_parallel = False  # Megatron disables it for TP=1 too

    @property
    def model_chunks(self) -> int:
        """Model chunks on each pipeline rank (the virtual pipeline size, 1 without interleaving)."""
        return self.virtual_pipeline_model_parallel_size or 1

    def data_parallel_size(self, world_size: int) -> int:
        """DP = world / (TP × PP × CP); ValueError when the world does not divide."""
        model_parallel = (self.tensor_model_parallel_size * self.pipeline_model_parallel_size
                          * self.context_parallel_size)
        if world_size % model_parallel:
            raise ValueError(f"world size {world_size} is not divisible by TP×PP×CP = {model_parallel}; "
                             "change parallel.* or the number of processes")
        return world_size // model_parallel

    def check_model(self, model: "ModelConfig") -> None:  # noqa: F821 (megatron_ext.model imports this module)
        """Clear errors for layouts Megatron would reject later (and less clearly)."""
        tp, pp = self.tensor_model_parallel_size, self.pipeline_model_parallel_size
        if model.num_attention_heads % tp:
            raise ValueError(f"parallel.tensor_model_parallel_size ({tp}) must divide "
                             f"model.num_attention_heads ({model.num_attention_heads})")
        if model.num_query_groups % tp:
            raise ValueError(f"parallel.tensor_model_parallel_size ({tp}) must divide "
                             f"model.num_query_groups ({model.num_query_groups})")
        if model.num_layers % pp:
            raise ValueError(f"parallel.pipeline_model_parallel_size ({pp}) must divide "
                             f"model.num_layers ({model.num_layers})")
        if model.num_layers % (pp * self.model_chunks):
            raise ValueError(f"model.num_layers ({model.num_layers}) must be divisible by "
                             f"PP × VP = {pp} × {self.model_chunks}; change "
                             "parallel.virtual_pipeline_model_parallel_size")
        layers_per_chunk = model.num_layers // (pp * self.model_chunks)
        if model.recompute_granularity == "full":
            if model.recompute_num_layers > layers_per_chunk:
                raise ValueError(f"model.recompute_num_layers ({model.recompute_num_layers}) must be between 1 "
                                 f"and the {layers_per_chunk} layers of a pipeline stage")
            if model.recompute_method == "uniform" and layers_per_chunk % model.recompute_num_layers:
                raise ValueError(f"model.recompute_method=uniform: model.recompute_num_layers "
                                 f"({model.recompute_num_layers}) must divide the {layers_per_chunk} layers "
                                 "of a pipeline stage")
        self.check_context_parallel(model)
        if self.context_parallel_size > 1 and not _cuda_available():
            raise ValueError("parallel.context_parallel_size > 1 needs GPUs (Megatron's context "
                             "parallel attention is Transformer Engine only); set it to 1 on CPU")

    def check_context_parallel(self, model: "ModelConfig") -> None:  # noqa: F821
        """Models whose attention needs every token's index or the whole key range on each rank: not under CP."""
        if self.context_parallel_size == 1:
            return
        if model.position_embedding_type == "alibi":
            raise ValueError("model.position_embedding_type=alibi does not support context parallelism; "
                             "set parallel.context_parallel_size=1")
        if model.scales_queries:
            raise ValueError("model.attn_temperature_tuning / model.ssmax_scale scale queries by their token index, "
                             "which a context-parallel rank does not hold: set parallel.context_parallel_size=1")
        if model.window_size is not None or model.softmax_type != "vanilla":
            # Not tested under Transformer Engine's context-parallel attention (no GPU here): refused, not guessed.
            raise ValueError("model.window_size / model.softmax_type (sliding windows, sinks) are not supported with "
                             "context parallelism: set parallel.context_parallel_size=1")


def _cuda_available() -> bool:
    import torch  # here, not at import: a config check without context parallelism needs no torch

    return torch.cuda.is_available()
