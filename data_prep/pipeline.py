"""The `build` pipeline: plan units, tokenise them in parallel, draw the validation split, assemble shards.

Stage 1 (tokenize_stage, parallel over units, across workers and MPI ranks) turns each unit
into work files; the validation draw and stage 2 (assemble_stage, parallel over outputs)
gather them into Megatron `.bin/.idx` shards; `summary` writes the manifest. Every step is
resumable: work files and shards are reused only under the same fingerprint (fingerprint.py).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import signal
import sys
import time
from multiprocessing import resource_tracker
from typing import Callable, Iterator, Optional

# Workers are processes; each tokenises single-threaded so `--workers N` means N cores.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np

from data_prep.assemble_stage import assemble, choose_valid, completed_output_entry, num_valid_documents
from data_prep.bpe_fast import sample_texts
from data_prep.checksums import matches_checksums
from data_prep.config import BuildConfig, BuildPlan
from data_prep.dist import Comm, get_comm
from pretrain.faults import DataError, naming_output
from pretrain.locks import FileLock
from data_prep.fingerprint import build_state, describe_changes, fingerprint
from data_prep.manifest import MANIFEST_VERSION, manifest_path, read_json, shard_prefix, valid_prefix, write_json_atomic
from data_prep.progress import Progress
from data_prep.units import plan_units
from data_prep.summary import no_documents_message, write_manifest
from data_prep.tokenize_stage import (WorkerContext, completed_unit_record, init_pool_worker, init_worker, tokenize_unit,
                                      unit_paths)
from data_prep.tokenizers import load_tokenizer
from data_prep.writer import import_megatron_in_background, megatron_indexed

__all__ = ["BuildConfig", "DataError", "build", "verify_existing"]

SKIP_PRINT_LIMIT = 20  # skip messages printed while tokenising (the manifest keeps more)


def _work_dir(output_prefix: str) -> str:
    directory, base = os.path.split(os.path.abspath(output_prefix))
    return os.path.join(directory, f".{base}_work")


def _log(comm: Comm, message: str) -> None:
    if comm.rank == 0:
        print(message, file=sys.stderr, flush=True)


def _map(fn: Callable, tasks: list, workers: int, context: WorkerContext,
         after_fork: Optional[Callable[[], None]] = None) -> Iterator:
    """Yield fn(task) for each task, in completion order, in-process or on a worker pool.

    `after_fork` runs once the pool's workers exist (never when the tasks run in-process).
    """
    if workers <= 1 or len(tasks) <= 1:
        init_worker(context)
        for task in tasks:
            yield fn(task)
        return
    # forkserver, not fork: by now this process may run threads (torch's, the Megatron import's), and a fork of a
    # multi-threaded process can deadlock the child (Python 3.12+ warns). Workers fork from a single-threaded
    # server that has imported the stage modules once; a stage-2 worker imports Megatron on its first shard.
    pool_context = mp.get_context("forkserver")
    pool_context.set_forkserver_preload(["data_prep.tokenize_stage", "data_prep.assemble_stage"])
    # Workers are born with Ctrl-C blocked (the mask passes through the forkserver's start and its forks) until
    # their initializer ignores it: one caught before that would print a KeyboardInterrupt traceback. The resource
    # tracker starts first, outside the block: its start-up unblocks SIGINT in the caller (pretrain.trainer.children).
    resource_tracker.ensure_running()
    unblocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        with pool_context.Pool(min(workers, len(tasks)), initializer=init_pool_worker, initargs=(context,)) as pool:
            signal.pthread_sigmask(signal.SIG_SETMASK, unblocked)  # from here a Ctrl-C ends the pool with the build
            if after_fork is not None:
                after_fork()
            yield from pool.imap_unordered(fn, tasks)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, unblocked)


def verify_existing(cfg: BuildConfig, expected_fingerprint: str) -> Optional[dict]:
    """The manifest if the build is already complete and every output matches its checksums."""
    manifest = read_json(manifest_path(cfg.output_prefix))
    if not manifest or manifest.get("fingerprint") != expected_fingerprint:
        return None
    base = os.path.dirname(os.path.abspath(cfg.output_prefix))
    for entry in manifest["shards"] + [manifest["valid"]]:
        if not matches_checksums(os.path.join(base, entry["prefix"]), entry):
            return None
    return manifest


def build(cfg: BuildConfig) -> dict:
    """Run the whole build (every MPI rank calls this) under the lock of its prefix; returns the manifest dict."""
    comm = get_comm(cfg.use_mpi)
    lock = _lock_prefix(cfg.output_prefix, comm)
    try:
        return _build(cfg, comm)
    except BaseException as e:
        if comm.size > 1 and not isinstance(e, SystemExit):
            print(f"[rank {comm.rank}] error: {e}", file=sys.stderr, flush=True)
            comm.abort(2)
        raise
    finally:
        lock.release()


def _lock_prefix(prefix: str, comm: Comm) -> FileLock:
    """Rank 0's lock on `prefix`: two builds into one prefix would write the same `.partial` files; the second
    is refused naming the first (a killed build's lock is dropped by the kernel, so it never blocks a rebuild)."""
    directory, name = os.path.split(os.path.abspath(prefix))
    path = os.path.join(directory, f".{name}_build.lock")  # it stays (unlinking races with a build locking it)
    lock, holder = FileLock(path), None
    if comm.rank == 0:
        with naming_output(path, what="build lock"):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            holder = lock.acquire()
    holder = comm.bcast(holder)
    if holder is not None:
        raise DataError(f"--data-prefix {prefix}: another data_prep build is writing it ({holder}, lock {path}); "
                        "wait for it to finish, or pass another --data-prefix")
    return lock


def _build(cfg: BuildConfig, comm: Comm) -> dict:
    started = time.time()
    plan = _make_plan(cfg)
    if _prepare_resume(cfg, plan, comm):
        _log(comm, f"{cfg.output_prefix}: already complete (inputs unchanged, manifest and checksums verified); "
                   "use --force to rebuild")
        return read_json(manifest_path(cfg.output_prefix))
    previous_manifest = read_json(manifest_path(cfg.output_prefix))
    context = WorkerContext(plan.tokenizer, cfg, plan.work_dir, plan.fingerprint)
    megatron_waits = _tokenize_units(cfg, plan, comm, context)
    valid, unit_records = _draw_validation(cfg, plan, comm)
    entries = _assemble_outputs(cfg, plan, comm, context, valid, unit_records, previous_manifest, megatron_waits)
    manifest = None
    if comm.rank == 0:
        manifest = write_manifest(cfg, plan, comm.size, unit_records, entries, time.time() - started)
        if not cfg.keep_work:
            shutil.rmtree(plan.work_dir, ignore_errors=True)
    comm.barrier()
    return comm.bcast(manifest)


def _make_plan(cfg: BuildConfig) -> BuildPlan:
    if cfg.num_shards < 1:
        raise DataError(f"--num-shards {cfg.num_shards}: must be >= 1")
    tokenizer = load_tokenizer(cfg.tokenizer, cfg.eod_token, cfg.special_tokens)
    units = plan_units(cfg.inputs, cfg.fmt, cfg.jsonl_key, cfg.chunk_bytes, cfg.normalize, cfg.invalid_utf8)
    if tokenizer.backend == "tiktoken":  # exactness checked on this input, not assumed
        tokenizer.check_fast_path(sample_texts(units))
    state = build_state(MANIFEST_VERSION, cfg.output_settings(), tokenizer.sha256, units)
    return BuildPlan(tokenizer, units, state, fingerprint(state), _work_dir(cfg.output_prefix))


def _prepare_resume(cfg: BuildConfig, plan: BuildPlan, comm: Comm) -> bool:
    """True when a complete, verified build already exists; otherwise readies the work directory (rank 0 decides)."""
    complete = None
    if comm.rank == 0:
        complete = _prepare_resume_on_rank0(cfg, plan)
    return comm.bcast(complete)


def _prepare_resume_on_rank0(cfg: BuildConfig, plan: BuildPlan) -> bool:
    manifest_file = manifest_path(cfg.output_prefix)
    with naming_output(plan.work_dir):
        os.makedirs(os.path.dirname(plan.work_dir), exist_ok=True)
    if cfg.force:
        shutil.rmtree(plan.work_dir, ignore_errors=True)
        if os.path.exists(manifest_file):
            os.remove(manifest_file)
    elif verify_existing(cfg, plan.fingerprint) is not None:
        return True
    interrupted = read_json(os.path.join(plan.work_dir, "plan.json"))
    finished = read_json(manifest_file)
    stale_work = interrupted is not None and interrupted.get("fingerprint") != plan.fingerprint
    stale_manifest = finished is not None and finished.get("fingerprint") != plan.fingerprint
    if stale_work or stale_manifest:
        previous = interrupted.get("state") if stale_work else _state_of_manifest(finished)
        print(f"{cfg.output_prefix}: inputs or settings changed since the last build, rebuilding: "
              + "; ".join(describe_changes(previous, plan.state)), file=sys.stderr, flush=True)
    if stale_work:
        shutil.rmtree(plan.work_dir, ignore_errors=True)
    if stale_manifest:  # its shards are about to be replaced: nothing may train on a half-rebuilt set
        os.remove(manifest_file)
    with naming_output(plan.work_dir):
        os.makedirs(plan.work_dir, exist_ok=True)
    write_json_atomic(os.path.join(plan.work_dir, "plan.json"), {"fingerprint": plan.fingerprint, "state": plan.state})
    return False


def _state_of_manifest(manifest: dict) -> dict:
    """The fingerprinted build state as far as a finished manifest records it (units are not kept)."""
    return {"version": manifest.get("version"), "settings": manifest.get("settings", {}),
            "tokenizer_sha256": manifest.get("tokenizer", {}).get("sha256"),
            "files": manifest.get("input_files"), "units": None} if "input_files" in manifest else {}


def _tokenize_units(cfg: BuildConfig, plan: BuildPlan, comm: Comm, context: WorkerContext) -> list:
    """Stage 1 on this rank; returns the waits of the Megatron import started alongside it."""
    units = plan.units
    # LPT order: biggest units first balances workers and ranks.
    order = sorted(range(len(units)), key=lambda i: (-units[i].est_bytes, i))
    mine = order[comm.rank::comm.size]
    pending, already_done = [], []
    for i in mine:
        (already_done if completed_unit_record(plan.work_dir, i, plan.fingerprint) else pending).append(i)
    _log(comm, f"stage 1/2: tokenising {len(units)} units with {cfg.workers} worker(s) x {comm.size} rank(s) "
               f"({len(already_done)} already done on rank 0); {plan.tokenizer}")
    bar = Progress(sum(units[i].est_bytes for i in mine), enabled=cfg.progress and comm.rank == 0, desc="tokenise")
    bar.update(sum(units[i].est_bytes for i in already_done), 0, 0)
    printed = 0
    # Megatron (for stage 2) is imported while the workers tokenise.
    megatron_waits: list = []
    for unit_record in _map(tokenize_unit, [(i, units[i]) for i in pending], cfg.workers, context,
                            after_fork=lambda: megatron_waits.append(import_megatron_in_background())):
        bar.update(unit_record["in_bytes"], unit_record["docs_read"], unit_record["tokens"])
        for message in unit_record["skip_log"]:
            if printed < SKIP_PRINT_LIMIT:
                bar.write(f"skipped: {message}")
            printed += 1
    bar.close()
    comm.barrier()
    return megatron_waits


def _draw_validation(cfg: BuildConfig, plan: BuildPlan, comm: Comm) -> tuple[np.ndarray, list[dict]]:
    """(validation documents as (unit, index) rows, every unit's record), decided on rank 0."""
    payload = None
    if comm.rank == 0:
        records = [read_json(unit_paths(plan.work_dir, u)["json"]) for u in range(len(plan.units))]
        missing = [plan.units[u].name for u, r in enumerate(records)
                   if not r or r.get("fingerprint") != plan.fingerprint]
        if missing:
            raise DataError(f"units missing after stage 1: {missing[:5]}; fix: rerun the same command to resume")
        total_docs = sum(r["docs_ok"] for r in records)
        if total_docs == 0:
            raise DataError(no_documents_message(cfg, plan.units, records))
        num_valid = num_valid_documents(cfg.valid_docs, cfg.valid_fraction, total_docs)
        payload = (choose_valid(plan.work_dir, len(plan.units), num_valid), records)
    return comm.bcast(payload)


def _assemble_outputs(cfg: BuildConfig, plan: BuildPlan, comm: Comm, context: WorkerContext, valid: np.ndarray,
                      unit_records: list[dict], previous_manifest: Optional[dict],
                      megatron_waits: list) -> Optional[dict]:
    """Stage 2 on this rank; returns every output's manifest entry on rank 0 (None elsewhere)."""
    names: list = list(range(cfg.num_shards)) + ["valid"]
    prefixes = {name: valid_prefix(cfg.output_prefix) if name == "valid" else shard_prefix(cfg.output_prefix, name)
                for name in names}
    mine = names[comm.rank::comm.size]
    entries, outputs_to_write = {}, []
    for name in mine:
        entry = completed_output_entry(plan.work_dir, name, prefixes[name], plan.fingerprint, previous_manifest)
        if entry is None:
            outputs_to_write.append(name)
        else:
            entries[name] = entry
    _log(comm, f"stage 2/2: writing {len(names)} outputs ({len(mine) - len(outputs_to_write)} complete on rank 0)")
    for wait in megatron_waits:
        wait()  # surfaces an import failure here, before any shard is written
    if outputs_to_write:
        megatron_indexed()  # a failed import is one error here, not one per worker
    tasks = [(name, prefixes[name], plan.work_dir, len(plan.units), valid, plan.fingerprint, plan.dtype)
             for name in outputs_to_write]
    total_tokens = sum(r["tokens"] for r in unit_records)
    bar = Progress(total_tokens * np.dtype(plan.dtype).itemsize // max(1, comm.size),
                   enabled=cfg.progress and comm.rank == 0, desc="write")
    for entry in _map(assemble, tasks, cfg.workers, context):
        entries[entry["name"]] = entry
        bar.update(entry["bin_bytes"], entry["documents"], entry["tokens"])
    bar.close()
    gathered = comm.gather(entries)
    if gathered is None:
        return None
    return {name: entry for rank_entries in gathered for name, entry in rank_entries.items()}
