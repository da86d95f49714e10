"""The plan of one run: parameters, bytes per GPU by component, peak, FLOPs, time and cost."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from pretrain.plan import activations
from pretrain.plan.hardware import CONTEXT_ALLOWANCE_BYTES, FRAGMENTATION, GPUS, Gpu
from pretrain.plan.measured import measured_mfu
from pretrain.plan.params import stage_params, state_bytes, total_parameters


@dataclass(frozen=True)
class Layout:
    """Where the run goes: GPUs, parallel sizes, micro-batching, precision."""

    nodes: int
    gpus_per_node: int
    tp: int
    pp: int
    dp: int
    cp: int
    vp: int | None
    micro_batch: int
    microbatches: int  # per optimizer step on each DP rank
    sequence_parallel: bool
    distributed_optimizer: bool
    precision: str  # bf16 | fp8 | fp32

    @property
    def world(self) -> int:
        """GPUs in the run."""
        return self.tp * self.pp * self.dp * self.cp


@dataclass
class StagePlan:
    """Bytes on one GPU of one pipeline stage."""

    stage: int
    params: int
    weights: int
    grads: int
    optimizer: float
    activations: float
    in_flight: float
    logits: float
    backward_temporaries: float
    fragmentation: float
    allowance: int

    @property
    def peak(self) -> float:
        """Sum of every component: the predicted peak of this GPU."""
        return (self.weights + self.grads + self.optimizer + self.activations + self.logits
                + self.backward_temporaries + self.fragmentation + self.allowance)


@dataclass
class Plan:
    """Everything `pretrain plan` prints."""

    name: str
    gpu: str
    gpu_label: str
    gpu_memory: int
    layout: Layout
    total_params: int
    embedding_params: int
    non_embedding_params: int
    stages: list[StagePlan]
    flops_per_token: float
    tokens: int
    iterations: int
    tokens_per_step: int
    peak_tflops: float
    mfu: float
    mfu_source: str
    step_seconds: float
    tokens_per_second: float
    wall_seconds: float
    gpu_hours: float
    notes: list[str] = field(default_factory=list)

    @property
    def worst(self) -> StagePlan:
        """The stage with the highest peak (the one that decides whether the run fits)."""
        return max(self.stages, key=lambda s: s.peak)

    @property
    def headroom(self) -> float:
        """GPU memory minus the worst stage's peak (negative: does not fit)."""
        return self.gpu_memory - self.worst.peak

    @property
    def fits(self) -> bool:
        """True when the worst stage's peak is within the GPU's memory."""
        return self.headroom >= 0

    def to_json(self) -> dict:
        """A JSON-safe dict (bytes as integers)."""
        out = asdict(self)
        out["stages"] = [{**asdict(s), "peak": s.peak} for s in self.stages]
        out.update(peak=self.worst.peak, headroom=self.headroom, fits=self.fits, worst_stage=self.worst.stage)
        return out


def _act_bytes(precision: str) -> int:
    return 4 if precision == "fp32" else 2


def _mfu(config, gpu_name: str, gpu: Gpu, precision: str, given: float | None) -> tuple[float, str]:
    """The MFU to plan with and where it comes from: --mfu, else a stored measurement, else the published figure."""
    if given is not None:
        return given, "--mfu"
    from pretrain.naming import size_name

    measured = measured_mfu(gpu_name, size_name(config.model), precision)
    if measured is not None:
        return measured.mfu, measured.source(config.model.padded_vocab_size())
    return gpu.mfu, f"published: {gpu.mfu_source}; never measured for this size"


def build_plan(config, layout: Layout, gpu_name: str, mfu: float | None = None,
               allowance: int = CONTEXT_ALLOWANCE_BYTES) -> Plan:
    """The plan of `config` (a TrainConfig) on `layout` with GPUs `gpu_name`."""
    gpu: Gpu = GPUS[gpu_name]
    model = config.model
    act = _act_bytes(layout.precision)
    local = model.transformer_impl == "local"
    seq = model.seq_length // layout.cp
    layer = activations.Layer(seq=seq, micro_batch=layout.micro_batch, hidden=model.hidden_size,
                              ffn=model.ffn_hidden_size, heads=model.num_attention_heads,
                              q_size=model.num_attention_heads * model.kv_channels,
                              kv_size=model.num_query_groups * model.kv_channels, tp=layout.tp,
                              sequence_parallel=layout.sequence_parallel, act_bytes=act,
                              impl=model.transformer_impl, hidden_dropout=model.hidden_dropout)
    layers_per_stage = model.num_layers // layout.pp
    stages = []
    for stage in sorted({0, layout.pp - 1}):
        held = stage_params(model, layout.tp, layout.pp, stage)
        state = state_bytes(held, dp=layout.dp * layout.cp, distributed_optimizer=layout.distributed_optimizer,
                            torch_adam=local)
        flight = activations.in_flight(layout.pp, stage, layout.microbatches, layout.vp)
        per_micro = activations.stage_bytes(layer, layers_per_stage, model.recompute_granularity,
                                            model.recompute_method, model.recompute_num_layers)
        if stage == 0:
            per_micro += activations.embedding_bytes(seq, layout.micro_batch)
        acts = flight * per_micro
        logits = activations.logits_bytes(layer, model.padded_vocab_size(layout.tp)) if stage == layout.pp - 1 else 0.0
        # Local linears (no gradient-accumulation fusion) build each weight gradient in the weight's dtype
        # before DDP adds it into the fp32 main_grad buffer; the tied embedding's gradient from the output
        # layer waits in autograd's input buffer until the embedding's own backward, i.e. through the
        # whole backward pass. By then the logits buffer (fp32 softmax, 16-bit logits, final norm) is
        # freed, so the peak grows only by the difference (measured on CPU: benchmarks/bench_plan_memory.py).
        # TE on a GPU accumulates into main_grad directly.
        released = logits
        largest = max(n * size for _, n, size in held.tensors)
        temporaries = max(0.0, largest - released) if local else 0.0
        stages.append(StagePlan(stage=stage, params=held.numel, weights=state.weights, grads=state.grads,
                                optimizer=state.optimizer, activations=acts, in_flight=flight, logits=logits,
                                backward_temporaries=temporaries,
                                fragmentation=FRAGMENTATION * (acts + logits), allowance=allowance))
    total, embedding = total_parameters(model)
    flops = model.flops_per_token()
    tokens = config.train_tokens()
    iterations = config.train_iters()
    per_step = config.tokens_per_iteration()
    notes = [] if config.positions.strategy != "drope" else [drope_budget(config, iterations, per_step)]
    if layout.precision == "fp8":
        if gpu.fp8_tflops is None:
            raise ValueError(f"--gpu {gpu_name} has no FP8 tensor cores; use --precision bf16")
        peak = gpu.fp8_tflops
        notes.append("fp8: memory planned as bf16 (Transformer Engine keeps bf16 weights, fp32 main params, "
                     "and saves most activations in bf16); FLOP/s at the FP8 dense peak")
    else:
        peak = gpu.bf16_tflops if layout.precision == "bf16" else gpu.bf16_tflops / 2
        if layout.precision == "fp32":
            notes.append("fp32: TF32 tensor-core peak (half the BF16 peak) assumed")
    used_mfu, source = _mfu(config, gpu_name, gpu, layout.precision, mfu)
    step = per_step * flops / (layout.world * peak * 1e12 * used_mfu)
    wall = iterations * step
    return Plan(name=config.name, gpu=gpu_name, gpu_label=gpu.label, gpu_memory=gpu.memory_bytes, layout=layout,
                total_params=total, embedding_params=embedding, non_embedding_params=total - embedding,
                stages=stages, flops_per_token=flops, tokens=tokens, iterations=iterations, tokens_per_step=per_step,
                peak_tflops=peak, mfu=used_mfu, mfu_source=source, step_seconds=step,
                tokens_per_second=per_step / step, wall_seconds=wall, gpu_hours=wall * layout.world / 3600,
                notes=notes)


def drope_budget(config, iterations: int, per_step: int) -> str:
    """DroPE's two phases within the run's budget (megatron_ext/positions/drope.py): the note `plan` prints."""
    from megatron_ext.positions.drope import switch_step

    switch = switch_step(iterations, config.positions.drope_share)
    pretraining = config.positions.drope_pretraining
    return (f"DroPE: steps 1-{switch:,} pretrain with {'RoPE' if pretraining == 'none' else pretraining + ' RoPE'} "
            f"({switch * per_step:,} tokens), steps {switch + 1:,}-{iterations:,} recalibrate without RoPE "
            f"({(iterations - switch) * per_step:,} tokens, {100 * (iterations - switch) / iterations:.3g} %): "
            "the total is the run's budget, a baseline's")
