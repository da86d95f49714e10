"""`python -m pretrain train`: the training loop (resume, signals, logging, validation, checkpoints)."""

from __future__ import annotations

import itertools
import logging
import os
import signal
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch
import torch.distributed as dist

from pretrain.faults import FULL_OR_READ_ONLY, OutputError
from megatron_ext.positions import build_sampler
from pretrain.trainer import checkpoint, children, distributed, resume_check
from pretrain.trainer.config import REQUEUE_EXIT_CODE, TrainConfig, dump, to_dict
from pretrain.trainer.data import (DataError, DocumentSamples, Prefetcher, SyntheticTokens, build_datasets,
                                   document_eod, step_batches, task_source)
from pretrain.trainer.engine import Engine
from pretrain.trainer.health import Health
from pretrain.trainer.metrics import Metrics, config_summary
from pretrain.trainer.run_lock import RunLock
from pretrain.trainer.stragglers import StepTimes
from pretrain.trainer.watchdog import Watchdog, set_aside_previous

log = logging.getLogger("pretrain")
INTERRUPTED = 130  # 128 + SIGINT: a run given up by a second Ctrl-C before its stop save completed


class TrainingStopped(RuntimeError):
    """The run cannot go on (non-finite updates); the message names the step and what to change."""


class StopSignal:
    """Records SIGTERM/SIGUSR1 (SLURM's pre-timeout signal) and SIGINT (Ctrl-C) so the loop can save and exit.

    A second SIGINT gives up the stop save while it is not committing: KeyboardInterrupt, raised once, which
    run_cli reports in one line (exit 130) after removing the partial checkpoint. Once the stop save's commit has
    begun (`committing`, checkpoint.save's commit_guard) a Ctrl-C only counts: the outcome depends on whether the
    save completed, never on when during the save or the exit the second Ctrl-C came."""

    def __init__(self) -> None:
        self.received: str | None = None
        self._committed = False  # the stop save's commit began: this run exits 75 from it
        self._gave_up = False
        self._pid = os.getpid()  # forked helpers inherit the handler; only the trainer gives up on a second Ctrl-C
        for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
            signal.signal(sig, self._handle)

    @contextmanager
    def committing(self) -> Iterator[None]:
        """Around the stop save's commit: set first, so a handler that runs after it never cuts the rename or the
        pruning short; one that ran before abandoned a save that had not begun to commit."""
        self._committed = True
        yield

    def _handle(self, signum, _frame) -> None:
        if signum == signal.SIGINT and self.received == "SIGINT" and os.getpid() == self._pid \
                and not (self._committed or self._gave_up):
            self._gave_up = True  # once: a third Ctrl-C must not interrupt the clean-up of the second
            raise KeyboardInterrupt
        self.received = signal.Signals(signum).name

    def any_rank(self) -> bool:
        """True on every rank if any rank got the signal (ranks must agree to save together)."""
        if dist.get_world_size() == 1:  # no collective in a one-process world
            return bool(self.received)
        flag = torch.tensor([1.0 if self.received else 0.0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())


def closing_line(config: TrainConfig, run_dir: Path, iteration: int) -> str:
    """Where a finished run's checkpoint is, and the commands that read it next."""
    from pretrain.trainer.data import parse_blend

    data = "" if config.data.synthetic or not config.data.data_path else \
        f" --data {parse_blend(config.data.data_path)[0][1]}"
    return (f"done: the last checkpoint is {run_dir / f'iter_{iteration:07d}'}; next: python -m pretrain eval run "
            f"{run_dir}{data}  |  python -m pretrain export-hf {run_dir} --output hf/{run_dir.name}")


def train(config: TrainConfig) -> int:
    """Run (or resume) training; returns the process exit code (REQUEUE_EXIT_CODE after a signal)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    config.validate(world_size)  # before any process group exists
    resume_check.check_model_unchanged(config)  # before anything in the run directory is written
    _check_load(config)
    stop = StopSignal()
    children.install_fork_hook()  # forked checkpoint writers and data workers die with this process
    distributed.initialize(config.parallel, config.seed)
    lock = RunLock(config.run_dir)
    try:
        checkpoint.on_rank0(lock.acquire)  # before anything is written into the run directory
        return _train(config, stop)
    finally:
        lock.release()
        distributed.destroy()


def _loads_from_run_dir(config: TrainConfig) -> bool:
    """checkpoint.load names the run directory itself (Megatron-LM's --load = --save): resume there, or start
    fresh while it holds no checkpoint."""
    load = config.checkpoint.load
    return bool(load) and Path(load).resolve() == config.run_dir.resolve()


def _check_load(config: TrainConfig) -> None:
    """checkpoint.load must name an intact checkpoint before anything is written (CheckpointError, exit 2)."""
    if not config.checkpoint.load or _loads_from_run_dir(config):
        return
    try:
        checkpoint.resolve(config.checkpoint.load)
    except FileNotFoundError as error:
        raise checkpoint.CheckpointError(f"checkpoint.load={config.checkpoint.load}: {error}") from None


def _train(config: TrainConfig, stop: StopSignal) -> int:
    rank = dist.get_rank()
    total_iters = config.train_iters()
    dp_rank, dp_size = distributed.data_parallel_info()
    num_microbatches = config.num_microbatches(dp_size)
    run_dir = config.run_dir
    resume = checkpoint.on_rank0(lambda: checkpoint.plan_resume(run_dir, overwrite=config.checkpoint.overwrite))
    if rank == 0:
        for note in resume.notes:
            print(f"resume: {note}", flush=True)
        with checkpoint.run_output(run_dir, run_dir / "config.yaml", "the resolved config"):
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "config.yaml").write_text(dump(config))
        with checkpoint.run_output(run_dir, run_dir / "hang", "the previous hang report"):
            kept = set_aside_previous(run_dir)
        if kept:
            print(f"resume: {kept}", flush=True)
        print(f"config: {config_summary(config)} (resolved config saved to {run_dir / 'config.yaml'})", flush=True)
        print(f"model: {config.model.non_embedding_parameters() / 1e6:.2f}M non-embedding parameters, "
              f"{config.model.total_parameters(config.parallel.tensor_model_parallel_size) / 1e6:.2f}M total; "
              f"budget {config.train_tokens():,} tokens = {total_iters:,} iterations × "
              f"{config.tokens_per_iteration():,} tokens; DP={dp_size}, {num_microbatches} microbatches/step",
              flush=True)
    watchdog = Watchdog(run_dir, total_iters, 60.0 * config.parallel.distributed_timeout_minutes,
                        config.parallel.train_timeout_seconds).start()
    try:
        return _train_watched(config, stop, resume, watchdog)
    finally:
        watchdog.stop(failed=sys.exc_info()[1] is not None)


def _train_watched(config: TrainConfig, stop: StopSignal, resume: checkpoint.Resume, watchdog: Watchdog) -> int:
    rank = dist.get_rank()
    total_iters = config.train_iters()
    dp_rank, dp_size = distributed.data_parallel_info()
    num_microbatches = config.num_microbatches(dp_size)
    run_dir = config.run_dir
    train_timeout_s = config.parallel.train_timeout_seconds

    @contextmanager
    def long_section(name: str, kind: str) -> Iterator[None]:
        """Checkpoint saves and validation may take the start-up timeout, in the watchdog and the groups."""
        distributed.set_timeout(60.0 * config.parallel.distributed_timeout_minutes)
        try:
            with watchdog.phase(name, kind):
                yield
        finally:  # a failed save or validation must not leave the groups on the long timeout
            distributed.set_timeout(train_timeout_s)

    sampler = build_sampler(config.positions, seed=config.seed, train_seq_len=config.model.seq_length,
                            num_layers=config.model.num_layers, rotary_dim=config.model.rotary_dim,
                            rotary_base=config.model.rotary_base, total_steps=total_iters,
                            global_layers=config.model.global_rope_layers())
    engine = Engine(config.model, config.parallel, config.optimizer, total_iters,
                    per_sample_positions=sampler.needs_per_sample or config.data.document_masking,
                    recalibration_start=sampler.switch_step)
    engine.progress = watchdog.counters
    if rank == 0 and getattr(engine.model.module, "rope_paths", None):
        print(engine.model.module.rope_paths, flush=True)  # which RoPE kernel each layer takes
    if rank == 0:
        print(f"speed: {_speed_summary(config, engine)}", flush=True)
    if rank == 0 and sampler.switch_step is not None:  # DroPE: where the run drops RoPE (megatron_ext.positions.drope)
        switch = sampler.switch_step
        print("DroPE: every step without RoPE (a recalibration run)" if switch == 0 else
              f"DroPE: steps 1-{switch} with RoPE ({config.positions.drope_pretraining}), steps {switch + 1}-"
              f"{total_iters} without RoPE (recalibration; the learning-rate schedule restarts)", flush=True)

    start = 0
    if resume.candidates:
        path, record, notes = checkpoint.load_newest(resume, engine)
        start = record["iteration"]
        notes += checkpoint.on_rank0(lambda: checkpoint.set_aside_newer(run_dir, start))
        if rank == 0:
            for note in notes:
                print(f"resume: {note}", flush=True)
            print(f"resumed from iteration {start} ({path})", flush=True)
    elif config.checkpoint.load and not _loads_from_run_dir(config):
        checkpoint.load(config.checkpoint.load, engine, load_optimizer=False)
        if rank == 0:
            print(f"initialised weights from {checkpoint.resolve(config.checkpoint.load)}", flush=True)

    watchdog.counters.step = start  # a resumed run's ranks are compared from its checkpoint's step on
    gbs, mbs, seq = config.schedule.global_batch_size, config.schedule.micro_batch_size, config.model.seq_length
    eval_batches = config.logging.eval_iters
    if config.data.task:
        train_data, valid_data = task_source().datasets(config.data, seq, config.seed)
    elif config.data.synthetic:
        documents = config.data.document_masking or config.data.eod_mask_loss
        train_data = SyntheticTokens(config.model.vocab_size, seq, config.seed, total_iters * gbs,
                                     eod=document_eod(config.data, config.model.vocab_size) if documents else None)
        valid_data = SyntheticTokens(config.model.vocab_size, seq, config.seed + 1, eval_batches * gbs)
    else:
        with checkpoint.run_output(run_dir, run_dir / "data_cache", "the dataset index cache",
                                   faults=FULL_OR_READ_ONLY):  # the block reads the shards too
            train_data, valid_data = build_datasets(config.data.data_path, seq, config.seed, total_iters * gbs,
                                                    eval_batches * gbs, run_dir / "data_cache")

    if config.data.document_masking or config.data.eod_mask_loss:
        train_data = DocumentSamples(train_data, document_eod(config.data, config.model.vocab_size),
                                     config.data.document_masking, config.data.eod_mask_loss)

    def save(iteration: int, commit_guard=None) -> None:
        with long_section(f"the save of checkpoint {iteration}", "save"):
            engine.sync_params()  # overlap_param_gather defers the last update's all-gather
            checkpoint.save(run_dir, iteration, engine,
                            {"config": to_dict(config), "consumed_samples": iteration * gbs},
                            keep_last=config.checkpoint.keep_last, run_dir_exists=True,
                            commit_guard=commit_guard)

    resolved = {**to_dict(config), "train_iters": total_iters, "train_tokens": config.train_tokens()}
    metrics = Metrics(config, total_iters, start, run_config=resolved)
    exit_code = 0
    window_start, window_steps = time.time(), 0
    skipped_in_row, health = 0, Health(run_dir)
    step_times, straggler_interval = StepTimes(engine), config.logging.straggler_interval
    # data.prefetch: the next step's microbatches are read and stacked while this one trains
    prefetch = Prefetcher(train_data, start, total_iters, gbs, dp_rank, dp_size, mbs) if config.data.prefetch else None
    progress_postfix = ""  # the loss on the progress line, refreshed when the loss is read anyway
    try:
        for step in range(start, total_iters):
            step_times.begin()
            microbatches = prefetch.step(step) if prefetch else step_batches(train_data, step, gbs, dp_rank,
                                                                              dp_size, mbs)
            result = engine.train_step(microbatches, sampler, step, num_microbatches, mbs, seq)
            step_times.end(start_up=step == start)
            window_steps += 1
            done = step + 1
            if step == start:  # start-up is over: from now on a step must complete within the train timeout
                distributed.set_timeout(train_timeout_s)
            watchdog.progress(done)
            log_step = done % config.logging.log_interval == 0 or done == total_iters
            # the loss is a device tensor: read at log steps and skips only (one device sync per step otherwise)
            if log_step or not result.update_successful:
                progress_postfix = f"loss {result.loss:.4f}"
            metrics.step(done, progress_postfix)
            skipped_in_row = 0 if result.update_successful else skipped_in_row + 1
            # pruning keeps the last healthy checkpoint; the loss only where it is read anyway
            health.step(done, result.loss if log_step or skipped_in_row else None, result.update_successful)
            if skipped_in_row:
                _skipped(config, metrics, result, done, total_iters, skipped_in_row)
            if log_step:
                elapsed = time.time() - window_start
                step_time = elapsed / window_steps
                tokens_per_s = gbs * seq / step_time
                stats = sampler.stats(sampler.training(step, seq, first_sample=0, batch_size=mbs))
                mfu = metrics.mfu(tokens_per_s)
                metrics.scalars(done, {"train/loss": result.loss, "train/lr": result.lr,
                                       "train/grad_norm": result.grad_norm, "perf/tokens_per_s": tokens_per_s,
                                       "perf/step_time_s": step_time, **({} if mfu is None else {"perf/mfu": mfu}),
                                       **{f"positions/{k}": v for k, v in stats.items()}})
                alpha = f" | α {stats['alpha']:.3f}" if "alpha" in stats else ""
                metrics.console(
                    f"step {done}/{total_iters} | loss {result.loss:.4f} | lr {result.lr:.2e} | "
                    f"gnorm {result.grad_norm:.3f}{alpha} | max pos {stats.get('max_position', 0):.0f} | "
                    f"{tokens_per_s / 1e3:.1f}K tok/s | {step_time:.2f} s/step"
                    + ("" if mfu is None else f" | MFU {100 * mfu:.3g}%") + f" | ETA {metrics.eta()}")
                metrics.heartbeat(done)
                window_start, window_steps = time.time(), 0
            if straggler_interval and done % straggler_interval == 0:
                watchdog.counters.enter("the straggler report")  # a collective: a rank before it is behind
                gathered = step_times.gather(watchdog.take_stalls())
                first_counted = max(done - straggler_interval + 1, start + 2)  # start + 1 was start-up
                for line in gathered.lines(first_counted, done, config.logging.straggler_threshold, train_timeout_s):
                    metrics.console(line)
                metrics.scalars(done, gathered.scalars())
            if valid_data is not None and (done % config.logging.eval_interval == 0 or done == total_iters):
                # the same leading validation batches every time, so the curve is comparable
                valid = itertools.chain.from_iterable(
                    step_batches(valid_data, k, gbs, dp_rank, dp_size, mbs) for k in range(eval_batches))
                with long_section(f"validation after step {done}", "validation"):
                    valid_loss = engine.evaluate(valid, sampler, num_microbatches * eval_batches, mbs, seq,
                                                 trained_steps=done)
                metrics.scalars(done, {"valid/loss": valid_loss})
                metrics.console(f"step {done} | validation loss {valid_loss:.4f} (evaluation positions)")
            watchdog.counters.enter("the stop check")  # a collective: a rank before it is behind
            if stop.any_rank():
                save(done, commit_guard=stop.committing)
                metrics.console(f"received {stop.received or 'a stop signal on another rank'}: saved "
                                f"iteration {done}, exiting with {REQUEUE_EXIT_CODE} for requeue")
                exit_code = REQUEUE_EXIT_CODE
                break
            if done % config.checkpoint.save_interval == 0 or done == total_iters:
                save(done)
        else:
            if start >= total_iters:
                metrics.console(f"nothing to do: checkpoint is at iteration {start} of {total_iters}")
            metrics.console(closing_line(config, run_dir, max(start, total_iters)))
    finally:
        if prefetch:
            prefetch.close()
        watchdog.stop(failed=sys.exc_info()[1] is not None)  # a hang's exit, if there is one, comes first
        metrics.close()
    return exit_code


def _speed_summary(config: TrainConfig, engine: Engine) -> str:
    """The start-up line naming each speed switch as it took effect (benchmarks compare them)."""
    from megatron_ext.sdpa_attention import sdpa_backend
    from pretrain.trainer.optimizer_step import training_device

    device = training_device()
    attention = sdpa_backend(config.model, config.model.seq_length, device,
                             masked=config.data.document_masking,
                             tensor_model_parallel_size=config.parallel.tensor_model_parallel_size)
    return (f"SDPA backend {attention} on {device.type}{' (document masks)' if config.data.document_masking else ''}; "
            f"AdamW {'fused' if engine.adam_fused else 'foreach'} (optimizer.adam_fused); "
            f"data prefetch {'on' if config.data.prefetch else 'off'} (data.prefetch); "
            f"layers {'compiled' if config.model.compile else 'eager'} (model.compile); "
            f"micro-batch {config.schedule.micro_batch_size}")


def _skipped(config: TrainConfig, metrics: Metrics, result, done: int, total_iters: int, in_row: int) -> None:
    """Report a skipped update; raise TrainingStopped after too many in a row (steps counted from 1)."""
    limit = config.optimizer.max_consecutive_skipped_iters
    metrics.console(f"step {done}/{total_iters}: update skipped ({in_row} of at most {limit} in a row): "
                    f"{result.skip_reason}, loss scale {result.loss_scale:g}")
    if in_row >= limit:
        latest = checkpoint.latest_iteration(config.run_dir)
        # a resumed run keeps the checkpoint's LR schedule (Megatron's default), hence a new run for a new lr
        restart = (f"latest checkpoint: {checkpoint.iteration_dir(config.run_dir, latest)}; to retry with a lower "
                   f"optimizer.lr (now {config.optimizer.lr:g}) start a new run from its weights with --set "
                   f"checkpoint.load=<that dir> checkpoint.save=<new run dir>" if latest is not None else
                   f"no checkpoint yet; lower optimizer.lr (now {config.optimizer.lr:g})")
        raise TrainingStopped(
            f"stopped at step {done}/{total_iters} after {in_row} consecutive skipped updates, the last for "
            f"{result.skip_reason} at loss scale {result.loss_scale:g}; no non-finite weights were applied or saved "
            f"({restart}), or check the data; optimizer.max_consecutive_skipped_iters={limit} sets how many "
            "skipped updates in a row are tolerated")


def _print_error(error: Exception) -> None:
    """One line on stderr, from rank 0 only: every rank meets the same error (decided collectively)."""
    if os.environ.get("RANK", "0") == "0":
        print(f"error: {error}", file=sys.stderr, flush=True)


def run_cli(config: TrainConfig) -> int:
    """Train a validated config; the exit code (2 bad run directory/data, 1 stopped, 0 done)."""
    try:
        return train(config)
    except (checkpoint.CheckpointError, DataError) as error:  # bad run directory or data: exit 2, as bad config
        _print_error(error)
        return 2
    except (TrainingStopped, checkpoint.NonFiniteWeightsError) as error:
        _print_error(error)
        return 1
    except OutputError as error:  # a write fault met by this rank alone (status.json, TensorBoard): say it here
        print(f"error: {error}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:  # a second Ctrl-C before the stop save's commit: that save is abandoned
        removed = checkpoint.remove_partials(config.run_dir) if os.environ.get("RANK", "0") == "0" else []
        _print_error(ValueError(f"interrupted twice: the stop save was abandoned"
                                f"{' (removed the partial ' + ', '.join(removed) + ')' if removed else ''}; "
                                f"{checkpoint.resume_hint(config.run_dir)}"))
        return INTERRUPTED
