"""The `build` pipeline: tokenize units in parallel, choose the validation split, assemble shards.

Stage 1 (parallel over units, across workers and MPI ranks): each unit is read and tokenised
into a work file of raw token ids plus per-document lengths and two seeded hashes of the
document's key (one ranks it for the validation draw, one picks its train shard). A unit
is complete once its JSON record is written (atomically, last), so a crash loses at most
the units in flight.

Split: the validation set is the N documents with the smallest seeded hash -- exactly a
seeded shuffle of the whole corpus followed by taking the first N, but computable while
streaming. The validation stream is written in that shuffled order.

Stage 2 (parallel over shards): shard s gathers, in corpus order, the training documents
whose second hash maps to s, and is written with Megatron-Core's IndexedDatasetBuilder.
Neither stage's result depends on unit scheduling, worker count or rank count.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from itertools import chain
from typing import Optional

# Workers are processes; each tokenises single-threaded so `--workers N` means N cores.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np

from data_prep import __version__
from data_prep.dist import Comm, get_comm
from data_prep.manifest import (MANIFEST_VERSION, manifest_path, read_json, shard_prefix, valid_prefix,
                                write_json_atomic)
from data_prep.progress import Progress
from data_prep.readers import Unit, iter_unit, plan_units
from data_prep.tokenizers import Tokenizer, load_tokenizer
from data_prep.writer import (checksums, import_megatron_in_background, matches_checksums, megatron_indexed,
                              token_dtype)

DEFAULT_VALID_FRACTION = 0.0005  # the OpenWebText/nanoGPT convention
SKIP_LOG_LIMIT = 50  # skip messages kept per unit (all skips are counted)


class DataError(RuntimeError):
    """Bad input under --strict, or an unusable configuration."""


@dataclass
class BuildConfig:
    """Everything `build` needs; the output-affecting part is fingerprinted for resume."""

    inputs: list[str]
    tokenizer: str
    output_prefix: str
    num_shards: int = 1
    valid_fraction: Optional[float] = None
    valid_docs: Optional[int] = None
    seed: int = 1234
    workers: int = 1
    jsonl_key: str = "text"
    fmt: str = "auto"
    append_eod: bool = True
    eod_token: Optional[str] = None
    strict: bool = False
    force: bool = False
    chunk_bytes: int = 4 << 20
    batch_docs: int = 64
    keep_work: bool = False
    progress: bool = True
    use_mpi: Optional[bool] = None

    def output_settings(self) -> dict:
        """Settings that change the bytes written (worker count deliberately absent)."""
        return {
            "num_shards": self.num_shards, "valid_fraction": self.valid_fraction, "valid_docs": self.valid_docs,
            "seed": self.seed, "jsonl_key": self.jsonl_key, "format": self.fmt, "append_eod": self.append_eod,
            "eod_token": self.eod_token, "strict": self.strict, "chunk_bytes": self.chunk_bytes,
        }


def _work_dir(output_prefix: str) -> str:
    d, base = os.path.split(os.path.abspath(output_prefix))
    return os.path.join(d, f".{base}_work")


def _doc_hashes(seed: int, keys: list[str], num_shards: int) -> tuple[np.ndarray, np.ndarray]:
    """(valid-draw score, train shard) per document key, from a seeded 128-bit hash."""
    salt = f"{seed}\x00".encode()
    scores = np.empty(len(keys), dtype=np.uint64)
    shards = np.empty(len(keys), dtype=np.int32)
    for i, k in enumerate(keys):
        d = hashlib.blake2b(salt + k.encode("utf-8", "surrogatepass"), digest_size=16).digest()
        scores[i] = int.from_bytes(d[:8], "big")
        shards[i] = int.from_bytes(d[8:], "big") % num_shards
    return scores, shards


# ----------------------------------------------------------------------------- stage 1

_W: dict = {}  # per-worker state, set by the pool initializer (the tokenizer is loaded once)


def _init_worker(tok: Tokenizer, cfg: BuildConfig, work: str, fingerprint: str) -> None:
    _W.update(tok=tok, cfg=cfg, work=work, fingerprint=fingerprint, dtype=token_dtype(tok.vocab_size))


def _unit_paths(work: str, i: int) -> dict:
    b = os.path.join(work, f"u{i:06d}")
    return {"tok": b + ".tok", "meta": b + ".npz", "json": b + ".json"}


def unit_complete(work: str, i: int, fingerprint: str) -> Optional[dict]:
    """The unit's record if its work files are complete and intact, else None."""
    p = _unit_paths(work, i)
    rec = read_json(p["json"])
    if not rec or rec.get("fingerprint") != fingerprint:
        return None
    try:
        if os.path.getsize(p["tok"]) != rec["tok_bytes"] or os.path.getsize(p["meta"]) != rec["meta_bytes"]:
            return None
    except OSError:
        return None
    return rec


def tokenize_unit(task: tuple[int, Unit]) -> dict:
    """Stage 1 for one unit: read, tokenise, write work files; returns the unit's record."""
    i, unit = task
    tok, cfg, work, dtype = _W["tok"], _W["cfg"], _W["work"], _W["dtype"]
    p = _unit_paths(work, i)
    eod = tok.eod
    keys: list[str] = []
    lengths: list[int] = []
    skipped: dict[str, int] = {}
    skip_log: list[str] = []
    n_read = n_tokens = 0
    batch_keys: list[str] = []
    batch_texts: list[str] = []
    t0 = time.time()

    with open(p["tok"] + ".partial", "wb") as out:

        def flush() -> None:
            nonlocal n_tokens
            if not batch_texts:
                return
            enc = tok.encode_batch(batch_texts)
            n0 = len(lengths)
            lengths.extend(len(ids) + cfg.append_eod for ids in enc)
            n = sum(lengths[n0:])
            if cfg.append_eod:
                ids_iter = chain.from_iterable(chain.from_iterable((ids, (eod,)) for ids in enc))
            else:
                ids_iter = chain.from_iterable(enc)
            out.write(np.fromiter(ids_iter, dtype=dtype, count=n).data)
            n_tokens += n
            keys.extend(batch_keys)
            batch_keys.clear()
            batch_texts.clear()

        for rec in iter_unit(unit):
            n_read += 1
            if rec.skip_reason is not None:
                msg = f"{rec.where}: {rec.skip_reason}: {rec.message}"
                if cfg.strict:
                    raise DataError(f"--strict: {msg}")
                skipped[rec.skip_reason] = skipped.get(rec.skip_reason, 0) + 1
                if len(skip_log) < SKIP_LOG_LIMIT:
                    skip_log.append(msg)
                continue
            batch_keys.append(rec.key)
            batch_texts.append(rec.text)
            if len(batch_texts) >= cfg.batch_docs:
                flush()
        flush()

    scores, shards = _doc_hashes(cfg.seed, keys, cfg.num_shards)
    if len(set(keys)) != len(keys):  # keys name the document's place in the corpus; must be unique
        raise DataError(f"{unit.name}: duplicate document keys (same file given twice?)")
    with open(p["meta"] + ".partial", "wb") as fh:
        np.savez(fh, lengths=np.asarray(lengths, dtype=np.int64), scores=scores, shards=shards)
    os.replace(p["tok"] + ".partial", p["tok"])
    os.replace(p["meta"] + ".partial", p["meta"])
    rec = {
        "fingerprint": _W["fingerprint"], "unit": unit.describe(), "docs_read": n_read, "docs_ok": len(lengths),
        "tokens": n_tokens, "skipped": skipped, "skip_log": skip_log, "in_bytes": unit.est_bytes,
        "tok_bytes": os.path.getsize(p["tok"]), "meta_bytes": os.path.getsize(p["meta"]), "seconds": time.time() - t0,
    }
    write_json_atomic(p["json"], rec)
    return rec


# ----------------------------------------------------------------------------- split


def _num_valid(cfg: BuildConfig, total_docs: int) -> int:
    if cfg.valid_docs is not None:
        n = cfg.valid_docs
    else:
        frac = DEFAULT_VALID_FRACTION if cfg.valid_fraction is None else cfg.valid_fraction
        n = int(round(frac * total_docs))
        if frac > 0 and n == 0 and total_docs >= 2:
            n = 1  # a requested validation set is never silently empty
    if n < 0 or (n >= total_docs and total_docs > 0 and n > 0):
        raise DataError(f"validation set of {n} documents leaves no training documents (corpus has {total_docs})")
    return n


def choose_valid(work: str, n_units: int, n_valid: int) -> np.ndarray:
    """(unit, local index) of the n_valid lowest-score documents, in score order (= seeded shuffle).

    Streams over units keeping only the current best n_valid, so memory is O(n_valid + one unit).
    """
    best = np.zeros((0, 3), dtype=np.uint64)  # columns: score, unit, local
    if n_valid == 0:
        return best[:, 1:].astype(np.int64)
    for u in range(n_units):
        with np.load(_unit_paths(work, u)["meta"]) as z:
            s = z["scores"]
        if len(s) == 0:
            continue
        cand = np.stack([s, np.full(len(s), u, np.uint64), np.arange(len(s), dtype=np.uint64)], axis=1)
        allc = np.concatenate([best, cand])
        order = np.lexsort((allc[:, 2], allc[:, 1], allc[:, 0]))[:n_valid]
        best = allc[order]
    return best[:, 1:].astype(np.int64)


# ----------------------------------------------------------------------------- stage 2


class _UnitTokens:
    """Read access to one unit's token work file."""

    def __init__(self, work: str, u: int, dtype) -> None:
        p = _unit_paths(work, u)
        with np.load(p["meta"]) as z:
            self.lengths, self.shards = z["lengths"], z["shards"]
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64)
        self.tokens = np.memmap(p["tok"], dtype=dtype, mode="r") if self.offsets[-1] else np.zeros(0, dtype)

    def doc(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i]: self.offsets[i + 1]]


def _shard_docs(work: str, n_units: int, shard: int, valid_by_unit: dict, dtype):
    for u in range(n_units):
        ut = _UnitTokens(work, u, dtype)
        mask = ut.shards == shard
        if u in valid_by_unit:
            mask[valid_by_unit[u]] = False
        for i in np.flatnonzero(mask):
            yield ut.doc(int(i))
        del ut


def _valid_docs(work: str, valid: np.ndarray, dtype):
    cache: dict[int, _UnitTokens] = {}
    for u, i in valid:
        u = int(u)
        if u not in cache:
            cache[u] = _UnitTokens(work, u, dtype)
        yield cache[u].doc(int(i))


def assemble(task: tuple) -> dict:
    """Stage 2 for one output (a train shard index, or 'valid'); returns its manifest entry."""
    from data_prep.writer import write_indexed

    name, prefix, work, n_units, valid, fingerprint, dtype, num_shards = task
    t0 = time.time()
    if name == "valid":
        n_docs, n_tok = write_indexed(prefix, _valid_docs(work, valid, dtype), dtype)
    else:
        by_unit: dict[int, list[int]] = {}
        for u, i in valid:
            by_unit.setdefault(int(u), []).append(int(i))
        n_docs, n_tok = write_indexed(prefix, _shard_docs(work, n_units, name, by_unit, dtype), dtype)
    entry = {"name": name, "prefix": os.path.basename(prefix), "documents": n_docs, "tokens": n_tok,
             **checksums(prefix), "seconds": round(time.time() - t0, 3)}
    write_json_atomic(os.path.join(work, f"out_{name}.json"), {"fingerprint": fingerprint, **entry})
    return entry


def _output_complete(work: str, name, prefix: str, fingerprint: str, old_manifest: Optional[dict]) -> Optional[dict]:
    """The entry of an already-written output whose files still match their recorded checksums."""
    rec = read_json(os.path.join(work, f"out_{name}.json"))
    if rec and rec.get("fingerprint") == fingerprint and matches_checksums(prefix, rec):
        rec.pop("fingerprint")
        return rec
    if old_manifest and old_manifest.get("fingerprint") == fingerprint:
        entries = old_manifest["shards"] + [old_manifest["valid"]]
        for e in entries:
            if e["name"] == name and matches_checksums(prefix, e):
                return dict(e)
    return None


# ----------------------------------------------------------------------------- driver


def _fingerprint(cfg: BuildConfig, tok: Tokenizer, units: list[Unit]) -> str:
    blob = json.dumps({"v": MANIFEST_VERSION, "settings": cfg.output_settings(), "tokenizer": tok.sha256,
                       "units": [u.describe() for u in units], "inputs": [os.path.abspath(p) for p in cfg.inputs]},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _pool(workers: int, initargs: tuple):
    # fork: workers inherit imports (megatron/torch for stage 2) instead of paying them again.
    ctx = mp.get_context("fork")
    return ctx.Pool(workers, initializer=_init_worker, initargs=initargs)


def _map(fn, tasks: list, workers: int, initargs: tuple, after_fork=None):
    """Yield fn(task) for each task, in completion order, in-process or on a worker pool.

    `after_fork` runs once the pool's workers exist (never when the tasks run in-process).
    """
    if workers <= 1 or len(tasks) <= 1:
        _init_worker(*initargs)
        for t in tasks:
            yield fn(t)
        return
    with _pool(min(workers, len(tasks)), initargs) as pool:
        if after_fork is not None:
            after_fork()
        yield from pool.imap_unordered(fn, tasks)


def _log(comm: Comm, msg: str) -> None:
    if comm.rank == 0:
        print(msg, file=sys.stderr, flush=True)


def verify_existing(cfg: BuildConfig, fingerprint: str) -> Optional[dict]:
    """The manifest if the build is already complete and every output matches its checksums."""
    man = read_json(manifest_path(cfg.output_prefix))
    if not man or man.get("fingerprint") != fingerprint:
        return None
    base = os.path.dirname(os.path.abspath(cfg.output_prefix))
    for e in man["shards"] + [man["valid"]]:
        if not matches_checksums(os.path.join(base, e["prefix"]), e):
            return None
    return man


def build(cfg: BuildConfig) -> dict:
    """Run the whole build (every MPI rank calls this); returns the manifest dict."""
    comm = get_comm(cfg.use_mpi)
    try:
        return _build(cfg, comm)
    except BaseException as e:
        if comm.size > 1 and not isinstance(e, SystemExit):
            print(f"[rank {comm.rank}] error: {e}", file=sys.stderr, flush=True)
            comm.abort(2)
        raise


def _build(cfg: BuildConfig, comm: Comm) -> dict:
    t_start = time.time()
    if cfg.num_shards < 1:
        raise DataError("--num-shards must be >= 1")
    tok = load_tokenizer(cfg.tokenizer, cfg.eod_token)
    dtype = token_dtype(tok.vocab_size)
    units = plan_units(cfg.inputs, cfg.fmt, cfg.jsonl_key, cfg.chunk_bytes)
    fingerprint = _fingerprint(cfg, tok, units)
    work = _work_dir(cfg.output_prefix)
    out_dir = os.path.dirname(os.path.abspath(cfg.output_prefix))

    # --- resume / force (rank 0 decides, everyone follows)
    state = None
    if comm.rank == 0:
        os.makedirs(out_dir, exist_ok=True)
        if cfg.force:
            shutil.rmtree(work, ignore_errors=True)
            for p in [manifest_path(cfg.output_prefix)]:
                if os.path.exists(p):
                    os.remove(p)
        done = None if cfg.force else verify_existing(cfg, fingerprint)
        if done is None:
            plan = read_json(os.path.join(work, "plan.json"))
            if plan and plan.get("fingerprint") != fingerprint:
                _log(comm, "settings or inputs changed since the interrupted run: starting over")
                shutil.rmtree(work, ignore_errors=True)
            os.makedirs(work, exist_ok=True)
            write_json_atomic(os.path.join(work, "plan.json"),
                              {"fingerprint": fingerprint, "units": [u.describe() for u in units]})
        state = "done" if done is not None else "run"
    state = comm.bcast(state)
    if state == "done":
        man = read_json(manifest_path(cfg.output_prefix))
        _log(comm, f"{cfg.output_prefix}: already complete (manifest and checksums verified); use --force to rebuild")
        return man

    initargs = (tok, cfg, work, fingerprint)
    old_manifest = read_json(manifest_path(cfg.output_prefix))

    # --- stage 1: tokenise units (LPT order: biggest first balances workers and ranks)
    order = sorted(range(len(units)), key=lambda i: (-units[i].est_bytes, i))
    mine = order[comm.rank::comm.size]
    todo, records = [], {}
    for i in mine:
        rec = unit_complete(work, i, fingerprint)
        if rec is None:
            todo.append(i)
        else:
            records[i] = rec
    _log(comm, f"stage 1/2: tokenising {len(units)} units with {cfg.workers} worker(s) x {comm.size} rank(s) "
               f"({len(records)} already done on rank 0); {tok}")
    total_bytes = sum(units[i].est_bytes for i in mine)
    bar = Progress(total_bytes, enabled=cfg.progress and comm.rank == 0, desc="tokenise")
    bar.update(sum(units[i].est_bytes for i in records), 0, 0)
    printed = 0
    # Megatron (for stage 2) is imported while the workers tokenise; fresh units mean outputs to write.
    waits = []
    for rec in _map(tokenize_unit, [(i, units[i]) for i in todo], cfg.workers, initargs,
                    after_fork=lambda: waits.append(import_megatron_in_background())):
        bar.update(rec["in_bytes"], rec["docs_read"], rec["tokens"])
        for msg in rec["skip_log"]:
            if printed < 20:
                bar.write(f"skipped: {msg}")
            printed += 1
    bar.close()
    comm.barrier()

    # --- split (rank 0), then stage 2 over outputs
    if comm.rank == 0:
        all_recs = [read_json(_unit_paths(work, u)["json"]) for u in range(len(units))]
        missing = [units[u].name for u, r in enumerate(all_recs) if not r or r.get("fingerprint") != fingerprint]
        if missing:
            raise DataError(f"units missing after stage 1: {missing[:5]}")
        total_docs = sum(r["docs_ok"] for r in all_recs)
        if total_docs == 0:
            raise DataError("no documents could be read from the inputs (see skipped messages above)")
        n_valid = _num_valid(cfg, total_docs)
        valid = choose_valid(work, len(units), n_valid)
        payload = (valid, all_recs)
    else:
        payload = None
    valid, all_recs = comm.bcast(payload)

    names: list = list(range(cfg.num_shards)) + ["valid"]
    prefixes = {n: (valid_prefix(cfg.output_prefix) if n == "valid" else shard_prefix(cfg.output_prefix, n))
                for n in names}
    my_names = names[comm.rank::comm.size]
    entries, todo2 = {}, []
    for n in my_names:
        e = _output_complete(work, n, prefixes[n], fingerprint, old_manifest)
        if e is None:
            todo2.append(n)
        else:
            entries[n] = e
    _log(comm, f"stage 2/2: writing {len(names)} outputs ({len(my_names) - len(todo2)} complete on rank 0)")
    for wait in waits:
        wait()  # before any fork below
    if todo2:
        megatron_indexed()  # import once, before forking, so workers inherit it
    tasks = [(n, prefixes[n], work, len(units), valid, fingerprint, dtype, cfg.num_shards) for n in todo2]
    tok_total = sum(r["tokens"] for r in all_recs)
    bar = Progress(tok_total * np.dtype(dtype).itemsize // max(1, comm.size), enabled=cfg.progress and comm.rank == 0,
                   desc="write")
    for e in _map(assemble, tasks, cfg.workers, initargs):
        entries[e["name"]] = e
        bar.update(e["bin_bytes"], e["documents"], e["tokens"])
    bar.close()
    gathered = comm.gather(entries)
    man = None
    if comm.rank == 0:
        merged = {}
        for g in gathered:
            merged.update(g)
        man = _write_manifest(cfg, tok, units, all_recs, merged, fingerprint, dtype, comm, time.time() - t_start)
        if not cfg.keep_work:
            shutil.rmtree(work, ignore_errors=True)
    comm.barrier()
    return comm.bcast(man)


def _write_manifest(cfg: BuildConfig, tok: Tokenizer, units: list[Unit], recs: list[dict], entries: dict,
                    fingerprint: str, dtype, comm: Comm, seconds: float) -> dict:
    skipped: dict[str, int] = {}
    skip_log: list[str] = []
    for r in recs:
        for k, v in r["skipped"].items():
            skipped[k] = skipped.get(k, 0) + v
        skip_log.extend(r["skip_log"])
    shards = [entries[i] for i in range(cfg.num_shards)]
    valid = entries["valid"]
    read = sum(r["docs_read"] for r in recs)
    written = sum(e["documents"] for e in shards) + valid["documents"]
    n_skipped = sum(skipped.values())
    if read != written + n_skipped:  # never silently drop data
        raise DataError(f"accounting mismatch: read {read} != written {written} + skipped {n_skipped}")
    in_bytes = sum(u.est_bytes for u in units)
    tokens = sum(e["tokens"] for e in shards) + valid["tokens"]
    man = {
        "version": MANIFEST_VERSION,
        "data_prep_version": __version__,
        "fingerprint": fingerprint,
        "created_unix": int(time.time()),
        "inputs": [{"path": os.path.abspath(p), "bytes": _tree_bytes(p)} for p in cfg.inputs],
        "num_units": len(units),
        "tokenizer": {"path": tok.path, "kind": tok.kind, "sha256": tok.sha256, "vocab_size": tok.vocab_size,
                      "eod_id": tok.eod, "pad_id": tok.pad, "dtype": np.dtype(dtype).name,
                      "backend": getattr(tok, "backend", "sentencepiece")},
        "settings": {**cfg.output_settings(), "workers": cfg.workers, "ranks": comm.size},
        "documents": {"read": read, "written": written, "skipped": n_skipped, "train": written - valid["documents"],
                      "valid": valid["documents"]},
        "skipped_by_reason": dict(sorted(skipped.items())),
        "skipped_examples": skip_log[:1000],
        "tokens": {"total": tokens, "train": tokens - valid["tokens"], "valid": valid["tokens"]},
        "shards": shards,
        "valid": valid,
        "seconds": round(seconds, 2),
    }
    write_json_atomic(manifest_path(cfg.output_prefix), man)
    empty = [e["prefix"] for e in shards if e["documents"] == 0]
    print(f"\ndone in {seconds:.1f}s: {read} documents read = {written} written ({man['documents']['train']} train "
          f"in {cfg.num_shards} shard(s), {valid['documents']} valid) + {n_skipped} skipped {dict(skipped) or ''}\n"
          f"{tokens} tokens ({tokens / max(seconds, 1e-9):,.0f} tokens/s, {in_bytes / 1e6 / max(seconds, 1e-9):.2f} MB/s "
          f"input); manifest {manifest_path(cfg.output_prefix)}", file=sys.stderr, flush=True)
    if empty:
        print(f"warning: {len(empty)} shard(s) received no documents: {empty[:3]} (use fewer shards)", file=sys.stderr)
    return man


def _tree_bytes(p: str) -> int:
    if os.path.isfile(p):
        return os.path.getsize(p)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(p) for f in fs)
