"""`python -m pretrain eval all DIR`: evaluate every finished run under DIR not evaluated yet.

One JSON record per run in `--out` (default DIR/eval_records), named after the run's path under DIR.
A record is reused when it was made from the run's current checkpoint and already holds the
requested lengths (and G(C) contexts), so the command is resumable and cheap to rerun while a
grid is still training; running, stopped and failed runs are listed and left alone.
Records carry the run's `size` and `method`, which `eval report` groups by. With `--downstream
T1,T2` each finished run also gets lm-eval scores for the tasks it lacks (downstream_report).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from pretrain.table import EXTRAPOLATION


def record_path(out: Path, run_name: str) -> Path:
    """Where the record of a run (named by its path under DIR) goes."""
    return out / (run_name.replace("/", "__") + ".json")


def is_current(path: Path, iteration: int, lengths: list[int], contexts: list[int]) -> bool:
    """True when the record at `path` was made from checkpoint `iteration` and covers the request."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    have_gain = {int(c) for c in (record.get("context_gain") or {}).get("values", {})}
    return ((record.get("run_info") or {}).get("iteration") == iteration
            and {str(n) for n in lengths} <= set(record.get("lengths", {}))
            and set(contexts) <= have_gain)


def evaluate_all(root: str | Path, *, lengths: list[int] | None = None, data: str | None = None,
                 num_spans: int = 20, out: str | Path | None = None, backend: str = "hf", device: str = "cpu",
                 context_gain: list[int] | None = None, gain_window: int | None = None, gain_method: str = "exact",
                 max_batch_tokens: int | None = None, progress: bool = True, say=print,
                 downstream: dict | None = None, overrides: list[str] | tuple[str, ...] = ()) -> dict[str, list[str]]:
    """Evaluate the finished, not-yet-evaluated runs under `root`; returns run names by outcome (`overrides`:
    `--set` inference-time model fields for every run)."""
    from pretrain.evaluation import memory, metrics, report
    from pretrain.evaluation.downstream_report import carry_over, evaluate_grid
    from pretrain.evaluation.data import load_stream
    from pretrain.evaluation.record import evaluate
    from pretrain.evaluation.scorer_loading import load_scorer, resolve_backend
    from pretrain.runs import discover

    root = Path(root)
    out = Path(out) if out is not None else root / "eval_records"
    runs = discover(root)
    outcome: dict[str, list[str]] = {"evaluated": [], "current": [], "not finished": [], "failed": []}
    todo = []
    for run in runs:
        if not run.finished:
            outcome["not finished"].append(run.name)
            continue
        run_lengths = lengths or [EXTRAPOLATION * run.config.model.seq_length]
        if is_current(record_path(out, run.name), run.iteration, run_lengths, context_gain or []):
            outcome["current"].append(run.name)
        else:
            todo.append((run, run_lengths))
    say(f"eval all: {len(runs)} runs under {root}; {len(todo)} to evaluate, {len(outcome['current'])} evaluated "
        f"already, {len(outcome['not finished'])} not finished (running, stopped or failed: skipped)")
    for index, (run, run_lengths) in enumerate(todo, 1):
        started = time.time()
        source = data or run.config.data.data_path
        try:
            if source is None:
                raise ValueError("it trained on synthetic tokens: pass --data")
            memory.check_fits(run.path, memory.requests(run_lengths, context_gain, None, None, 0), num_spans, None,
                              max_batch_tokens or metrics.MAX_BATCH_TOKENS, resolve_backend(run.path, backend), device)
            scorer = load_scorer(run.path, backend=backend, name=run.name, device=device, overrides=overrides)
            stream = load_stream(source)
            if stream.note:
                say(f"[{index}/{len(todo)}] {run.name}: note: {stream.note}")
            record = evaluate(scorer, stream, run_lengths, num_spans, gain_contexts=context_gain,
                              gain_window=gain_window, gain_method=gain_method,
                              max_batch_tokens=max_batch_tokens or metrics.MAX_BATCH_TOKENS, progress=progress)
        except (ValueError, FileNotFoundError, RuntimeError) as error:
            outcome["failed"].append(run.name)
            say(f"[{index}/{len(todo)}] {run.name}: not evaluated: {error}")
            continue
        record.update(size=run.size, method=run.method, run_dir=str(run.path))
        carry_over(record_path(out, run.name), record, run.iteration)  # keep lm-eval scores of this checkpoint
        report.write_record(record, record_path(out, run.name))
        outcome["evaluated"].append(run.name)
        cliffs = ", ".join(f"cliff@{n} {e['cliff']['cliff']:+.3f}" for n, e in record["lengths"].items()
                           if e.get("cliff"))
        phase = (record.get("run_info") or {}).get("phase")
        say(f"[{index}/{len(todo)}] {run.name} ({run.size}, {run.method}, seed {run.seed}"
            f"{f', DroPE {phase}' if phase else ''}): "
            f"{cliffs or 'evaluated'} in {time.time() - started:.0f}s")
    if downstream:  # lm-eval tasks, after the loss evaluation wrote each run's record
        finished = [run for run in runs if run.finished]
        grid = evaluate_grid(finished, lambda name: record_path(out, name), device=device, say=say, **downstream)
        outcome["failed"] += [name for name in grid["failed"] if name not in outcome["failed"]]
        outcome["downstream"] = grid["evaluated"]
    say(f"records in {out}; compare with: python -m pretrain eval report {out}")
    return outcome
