"""One training step on Megatron-Core: DDP, its optimizer and LR schedule, pipeline schedules.

The position sampler is called once per microbatch on every rank and pipeline stage with the
global-batch index of the microbatch's first sequence; its draws are keyed on (seed, step,
global sample index), so every rank builds the same positions without communication and any
TP/PP/DP/CP layout, micro-batch size or accumulation count trains the same model. A batch
with position_length (right-padded task examples) passes it as the sampler's lengths; every
rank reads its own batches (no broadcast), so every rank that builds positions has them. Under
context parallelism each rank takes Megatron's zigzag slice of tokens, labels, loss mask and
the full-length positions, and the loss is reduced over the CP group (megatron_ext.context_parallel).
"""

from __future__ import annotations

from typing import Iterator

import torch

from megatron_ext import context_parallel
from megatron_ext.model import ModelConfig, ParallelConfig, build_model
from megatron_ext.positions import PositionSampler
from megatron_ext.positions.documents import Documents
from pretrain.trainer import optimizer_step
from pretrain.trainer.config import OptimizerSettings
from pretrain.trainer.hang_diagnosis import StepCounters
from pretrain.trainer.recalibration import RecalibrationSchedule


class StepResult:
    """What one optimizer step reports (loss averaged over microbatches and DP ranks).

    A step whose loss or gradients hold NaN/inf applies no update (update_successful=False, as
    Megatron's optimizer reports a loss-scale overflow) and leaves the LR schedule where it was.
    Loss, gradient norm, loss scale and skip reason stay on the device until read: the loop reads
    them at log intervals and on a skipped step, so other steps make one device→host sync."""

    def __init__(self, outcome: optimizer_step.StepOutcome, lr: float, loss_scale: torch.Tensor | float,
                 num_microbatches: int) -> None:
        self._outcome, self.lr, self._loss_scale = outcome, lr, loss_scale
        self.update_successful = not outcome.skipped
        self._num_microbatches = num_microbatches

    @property
    def loss(self) -> float:
        """Mean loss (a device→host read)."""
        return float(self._outcome.loss)

    @property
    def grad_norm(self) -> float:
        """Total gradient norm before clipping; NaN when the skip came before it (a device→host read)."""
        return float(self._outcome.grad_norm)

    @property
    def loss_scale(self) -> float:
        """The optimizer's loss scale (1.0 without fp16)."""
        return float(self._loss_scale)

    @property
    def skip_reason(self) -> str | None:
        """Why the update was skipped, naming the first non-finite microbatch when one is known."""
        if self.update_successful:
            return None
        if self._outcome.overflow:
            return "the optimizer found inf/NaN gradients (loss-scale overflow)"
        bad = self._outcome.bad_loss.nonzero()
        if bad.numel():
            return f"non-finite loss in microbatch {int(bad[0]) + 1}/{self._num_microbatches}"
        return "non-finite gradients (every microbatch's loss is finite)"


class Engine:
    """This rank's model chunks (one per virtual pipeline stage) in Megatron DDP, with optimizer and LR scheduler."""

    def __init__(self, model: ModelConfig, parallel: ParallelConfig, optim: OptimizerSettings,
                 train_iters: int, *, per_sample_positions: bool = False,
                 recalibration_start: int | None = None) -> None:
        from megatron.core import parallel_state
        from megatron.core.distributed import (DistributedDataParallel, DistributedDataParallelConfig,
                                               finalize_model_grads)
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
        from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

        self.model_config = model
        self.parallel = parallel
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, overlap_grad_reduce=parallel.overlap_grad_reduce,
            overlap_param_gather=parallel.overlap_param_gather,
            use_distributed_optimizer=parallel.use_distributed_optimizer)
        self.chunks = []  # Megatron's get_model: one model per virtual stage, each in its own DDP
        for vp_stage in range(parallel.model_chunks):
            virtual = parallel.virtual_pipeline_model_parallel_size is not None
            if virtual:
                parallel_state.set_virtual_pipeline_model_parallel_rank(vp_stage)
            stage = dict(ignore_virtual=False, vp_stage=vp_stage) if virtual else {}
            module = build_model(model, parallel,
                                 pre_process=parallel_state.is_pipeline_first_stage(**stage),
                                 post_process=parallel_state.is_pipeline_last_stage(**stage),
                                 per_sample_positions=per_sample_positions, vp_stage=vp_stage if virtual else None)
            if model.compile:  # each layer its own compiled region: identical layers share one compiled graph
                for layer in module.decoder.layers:
                    layer.compile()
            if torch.cuda.is_available():  # built on the CPU (model.use_cpu_initialization): Megatron's get_model
                module.cuda(torch.cuda.current_device())  # moves each chunk to its GPU before DDP, as here
            # only the first chunk's buffer is bucketed, as in Megatron's get_model
            self.chunks.append(DistributedDataParallel(module.config, ddp_config, module,
                                                       disable_bucketing=vp_stage > 0))
        if parallel.virtual_pipeline_model_parallel_size is not None:
            parallel_state.set_virtual_pipeline_model_parallel_rank(0)
        self.model = self.chunks[0]
        self.config = self.model.module.config
        self.progress = StepCounters()  # where the main thread is; the loop hands in the hang watchdog's

        def finalize(*args, **kwargs):
            # after the last microbatch's backward: a rank still in it is behind one that reached the reduction
            self.progress.enter("gradient sync")
            return finalize_model_grads(*args, **kwargs)

        self.config.finalize_model_grads_func = finalize
        no_sync = [chunk.no_sync for chunk in self.chunks]
        self.config.no_sync_func = no_sync[0] if len(no_sync) == 1 else no_sync
        optimizer_step.check_reaches()  # train_step runs Megatron's optimizer step as its parts
        self.optimizer = get_megatron_optimizer(
            OptimizerConfig(optimizer="adam", lr=optim.lr, min_lr=optim.min_lr,
                            weight_decay=optim.weight_decay, adam_beta1=optim.adam_beta1,
                            adam_beta2=optim.adam_beta2, adam_eps=optim.adam_eps,
                            clip_grad=optim.clip_grad, bf16=model.bf16, fp16=False,
                            params_dtype=self.config.params_dtype,
                            use_distributed_optimizer=parallel.use_distributed_optimizer),
            self.chunks)
        # optimizer.adam_fused (null: on CUDA): Megatron builds torch's AdamW without a `fused` argument
        self.adam_fused = torch.cuda.is_available() if optim.adam_fused is None else optim.adam_fused
        if self.adam_fused:
            optimizer_step.use_fused_adam(self.optimizer)
        def scheduler(warmup: int, decay: int) -> OptimizerParamScheduler:
            return OptimizerParamScheduler(
                self.optimizer, init_lr=0.0, max_lr=optim.lr, min_lr=optim.min_lr, lr_warmup_steps=warmup,
                lr_decay_steps=max(decay, 1), lr_decay_style=optim.lr_decay_style, start_wd=optim.weight_decay,
                end_wd=optim.weight_decay, wd_incr_steps=max(decay, 1), wd_incr_style="constant")

        if recalibration_start:  # DroPE switching inside the run: the schedule restarts there
            self.scheduler = RecalibrationSchedule(scheduler, start=recalibration_start, total_steps=train_iters,
                                                   warmup_iters=optim.lr_warmup_iters)
        else:
            self.scheduler = scheduler(optim.lr_warmup_iters, train_iters)

    def train_step(self, batches: Iterator[dict], sampler: PositionSampler, step: int,
                   num_microbatches: int, micro_batch_size: int, seq_length: int) -> StepResult:
        """Forward/backward over `num_microbatches` (any pipeline schedule), then one optimizer step."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        if isinstance(self.scheduler, RecalibrationSchedule):
            self.scheduler.begin(step)
        for chunk in self.chunks:
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad()
        self.progress.enter("forward-backward")
        forward_step = _ForwardStep(sampler, step, seq_length, micro_batch_size, num_microbatches, self.progress)
        losses = get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=self._per_chunk(batches), model=self.chunks,
            num_microbatches=num_microbatches, seq_length=seq_length,
            micro_batch_size=micro_batch_size, forward_only=False)
        # with NCCL the schedule returns before its kernels ran: a rank waiting for a peer blocks in here
        self.progress.enter("optimizer")
        loss, bad_loss = optimizer_step.reduce_losses(losses, num_microbatches)
        # Megatron's FP32 and BF16 optimizers step on NaN gradients (megatron-core 0.16.1: only the
        # fp16 grad scaler looks for them): a non-finite loss or gradient norm skips the update, on every
        # rank together (the loss is reduced over the world, the norm over Megatron's grad-stats group).
        outcome = optimizer_step.step(self.optimizer, loss, bad_loss)
        if not outcome.skipped:  # as Megatron: a skipped iteration does not advance the schedule
            self.scheduler.step(increment=1)
        return StepResult(outcome, self.optimizer.param_groups[0]["lr"], self.optimizer.get_loss_scale(),
                          num_microbatches)

    def _per_chunk(self, batches: Iterator[dict]) -> Iterator[dict] | list[Iterator[dict]]:
        """The interleaved schedule takes one iterator per chunk; each chunk reads every microbatch."""
        if len(self.chunks) == 1:
            return batches
        microbatches = list(batches)
        return [iter(microbatches) for _ in self.chunks]

    def prepare_optimizer_load(self) -> None:
        """Give a fresh distributed optimizer's torch Adam its (zero) state before a checkpoint load request.

        With torch's Adam (no TE/Apex), DistributedOptimizer.state_dict reads the one `step` shared by
        every param's state (`assert len(steps) == 1`), which a fresh torch optimizer does not have yet.
        Megatron's own dummy fill runs optimizer.step(), which would apply weight decay to the main
        params; zeros are written instead, and the load replaces every one of them."""
        for inner in self._distributed_torch_adams():
            for group in inner.param_groups:
                for param in group["params"]:
                    if not inner.state[param]:
                        # a fused step keeps its count on the param's device, foreach on the host
                        step_device = param.device if group.get("fused") else "cpu"
                        inner.state[param].update(step=torch.zeros((), dtype=torch.float32, device=step_device),
                                                  exp_avg=torch.zeros_like(param),
                                                  exp_avg_sq=torch.zeros_like(param))

    def load_optimizer_state(self, state: dict) -> None:
        """Load the optimizer part of a checkpoint (what `optimizer.sharded_state_dict(is_loading=True)` asked for).

        With torch's Adam, DistributedOptimizer.load_state_dict first gives every param state a `step`,
        then copies the checkpoint's fully-reshardable tensors into every key of that state; the
        checkpoint holds no per-param `step` (megatron-core 0.16.1: KeyError 'step'). So `step` is held
        aside between the two (torch's public load_state_dict post-hook) and put back after."""
        steps: dict = {}

        def hold_steps_aside(optimizer: torch.optim.Optimizer) -> None:
            for param, param_state in optimizer.state.items():
                if "step" in param_state:
                    steps[param] = (optimizer, param_state.pop("step"))

        handles = [inner.register_load_state_dict_post_hook(hold_steps_aside)
                   for inner in self._distributed_torch_adams()]
        try:
            self.optimizer.load_state_dict(state)
        finally:
            for handle in handles:
                handle.remove()
        # Megatron hands every param the same step tensor, which Adam's in-place `step += 1` would then
        # advance once per param: each param gets its own copy, as a fresh torch Adam has.
        fused = {id(param) for inner in self._distributed_torch_adams() for group in inner.param_groups
                 if group.get("fused") for param in group["params"]}
        for param, (optimizer, step) in steps.items():
            step = step.detach().clone()
            optimizer.state[param].setdefault("step", step.to(param.device) if id(param) in fused else step)

    def _distributed_torch_adams(self) -> list[torch.optim.Optimizer]:
        """The torch Adam/AdamW inside each DistributedOptimizer (none with TE/Apex optimizers or without distopt)."""
        from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

        found = []
        for optimizer in getattr(self.optimizer, "chained_optimizers", [self.optimizer]):
            inner = getattr(optimizer, "optimizer", None)
            if isinstance(optimizer, DistributedOptimizer) and isinstance(inner, (torch.optim.Adam, torch.optim.AdamW)):
                found.append(inner)
        return found

    def sharded_state_dict(self) -> dict:
        """The model's dist-checkpointing state: one chunk's, or {'chunk<i>': ...} (global tensor keys either way)."""
        if len(self.chunks) == 1:
            return self.model.module.sharded_state_dict()
        return {f"chunk{i}": chunk.module.sharded_state_dict() for i, chunk in enumerate(self.chunks)}

    def load_state_dict(self, state: dict) -> None:
        """Load what `sharded_state_dict` asked dist_checkpointing for."""
        if len(self.chunks) == 1:
            self.model.module.load_state_dict(state)
        else:
            for i, chunk in enumerate(self.chunks):
                chunk.module.load_state_dict(state[f"chunk{i}"])

    def sync_params(self) -> None:
        """Finish the deferred param all-gather of overlap_param_gather (before saving weights)."""
        if self.parallel.overlap_param_gather:
            for chunk in self.chunks:
                chunk.start_param_sync(force_sync=True)

    @torch.no_grad()
    def evaluate(self, batches: Iterator[dict], sampler: PositionSampler, num_microbatches: int,
                 micro_batch_size: int, seq_length: int, trained_steps: int | None = None) -> float:
        """Mean loss over `num_microbatches` with evaluation positions (forward only); `trained_steps`: the steps
        the weights trained for (DroPE validates a pretraining-phase model with its RoPE)."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        for chunk in self.chunks:
            chunk.eval()
        try:
            losses = get_forward_backward_func()(
                forward_step_func=_ForwardStep(sampler, None, seq_length, micro_batch_size, num_microbatches,
                                               self.progress, trained_steps=trained_steps),
                data_iterator=self._per_chunk(batches),
                model=self.chunks, num_microbatches=num_microbatches, seq_length=seq_length,
                micro_batch_size=micro_batch_size, forward_only=True)
        finally:
            for chunk in self.chunks:
                chunk.train()
        return _reduce_loss(losses, num_microbatches)[0]


class _ForwardStep:
    """Megatron forward_step_func: fetch a microbatch, make its positions, run the model."""

    def __init__(self, sampler: PositionSampler, step: int | None, seq_length: int, micro_batch_size: int,
                 num_microbatches: int, progress: StepCounters | None = None, *,
                 trained_steps: int | None = None) -> None:
        from megatron.core import parallel_state

        self.sampler, self.step, self.seq_length = sampler, step, seq_length
        self.trained_steps = trained_steps
        self.progress = progress or StepCounters()
        self.micro_batch_size = micro_batch_size
        # Schedules call each model chunk in microbatch order, so counting per chunk gives every
        # chunk (virtual stage) the positions of the same microbatch.
        self.microbatches: dict[int, int] = {}
        # step_batches gives DP rank r the global-batch samples [r * per_rank, (r + 1) * per_rank).
        self.rank_first_sample = parallel_state.get_data_parallel_rank() * num_microbatches * micro_batch_size
        self.cp_group = parallel_state.get_context_parallel_group() \
            if parallel_state.get_context_parallel_world_size() > 1 else None

    def __call__(self, data_iterator, model):
        batch = next(data_iterator)
        tokens, labels, loss_mask = batch["tokens"], batch["labels"], batch["loss_mask"]
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        # non-blocking: from pinned memory (data.prefetch with CUDA) the copies overlap the compute queued before
        tokens, labels, loss_mask = (tokens.to(device, non_blocking=True), labels.to(device, non_blocking=True),
                                     loss_mask.to(device, non_blocking=True))
        # data.document_masking: positions restart per document and one block-diagonal causal mask
        # [b, 1, s, s] serves every layer (on every pipeline stage, each reading its own batch).
        documents = Documents(batch["document_index"].to(device, non_blocking=True)) \
            if "document_index" in batch else None
        attention_mask = None if documents is None else documents.attention_mask()
        microbatch = self.microbatches.get(id(model), 0)
        self.microbatches[id(model)] = microbatch + 1
        self.progress.microbatch += 1  # the hang watchdog's counter: forward passes started, all chunks
        # Full-length positions first: a position depends on its place in the whole sequence.
        if self.step is None:
            positions = self.sampler.evaluation(tokens.shape[1], device=device, trained_steps=self.trained_steps)
        else:
            first_sample = self.rank_first_sample + microbatch * self.micro_batch_size
            # position_length stays on the CPU: the sampler range-checks it without a device sync.
            positions = self.sampler.training(self.step, tokens.shape[1], first_sample=first_sample,
                                              batch_size=tokens.shape[0], device=device,
                                              lengths=batch.get("position_length"), documents=documents)
        if self.cp_group is not None:
            sliced = context_parallel.slice_batch({"tokens": tokens, "labels": labels, "loss_mask": loss_mask},
                                                  self.cp_group)
            tokens, labels, loss_mask = sliced["tokens"], sliced["labels"], sliced["loss_mask"]
            positions = context_parallel.slice_positions(positions, self.cp_group)
        output = model(tokens, positions, attention_mask, labels=labels)
        cp_group = self.cp_group

        def loss_func(output_tensor: torch.Tensor):
            loss, reported = context_parallel.masked_mean_loss(output_tensor, loss_mask, cp_group)
            # reported is a fresh tensor: the schedule scales the returned loss in place
            return loss, {"lm loss": reported, "microbatch": microbatch}

        return output, loss_func


def _reduce_loss(losses: list[dict], num_microbatches: int | None = None) -> tuple[float, int | None]:
    """(mean loss on the last stage averaged over DP, first microbatch with a non-finite loss), on every rank."""
    loss, bad = optimizer_step.reduce_losses(losses, num_microbatches or max(len(losses), 1))
    first_bad = bad.nonzero()
    return float(loss), (int(first_bad[0]) if first_bad.numel() else None)
