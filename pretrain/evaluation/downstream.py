"""`python -m pretrain eval downstream`: EleutherAI's lm-evaluation-harness on our models.

A Megatron checkpoint goes through our HF export (`pretrain.hf.export.export_checkpoint`) into
a temporary directory, which lm-eval's own `hf` model class (HFLM) then loads exactly as it
loads any Hugging Face directory: `eval downstream RUN` and `lm_eval --model hf
--model_args pretrained=EXPORT` score the same model with the same code, so their numbers are
identical. Position handling lives in the exported config.json (pretrain.hf.rope): PosAug and
the other training-time strategies evaluate with plain RoPE, RFS with the linear scaling that
reproduces its evaluation positions for --context-length, and --rope-scaling PI/NTK/YaRN is
written in HF's own vocabulary. An HF directory with --rope-scaling gets the same config.json
fields in a temporary copy (weights linked, not copied).

lm-eval is imported only inside these functions: it is an optional extra and slow to import.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
import os
import re
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator

INSTALL_HINT = "pip install 'posaug-megatron[eval]'"
RESULTS_DIR = "downstream"  # under the run (or HF) directory: lm-eval's results JSON files
HEADLINE_METRICS = ("acc_norm", "acc")  # what `eval report` shows per task (HellaSwag convention first)


def import_lm_eval():
    """The lm_eval module, or ValueError with the install command."""
    try:
        import lm_eval
        import lm_eval.models.huggingface  # noqa: F401 - needs the [hf] extra (accelerate)
    except ImportError as error:
        raise ValueError(f"eval downstream needs EleutherAI's lm-evaluation-harness: {INSTALL_HINT} "
                         f"(import failed: {error})") from None
    return lm_eval


def task_manager(include_path: str | None = None, tasks: list[str] | None = None):
    """lm-eval's TaskManager with the user's task YAML directory (checked to exist).

    Indexing lm-eval's own few thousand task files takes most of a small run, so when every
    requested task is in `include_path` only that directory is indexed.
    """
    import_lm_eval()
    if include_path is not None and not Path(include_path).exists():
        raise FileNotFoundError(f"--include-path {include_path}: no such directory of task YAML files")
    if include_path is not None and tasks:
        own = _cached_manager(str(Path(include_path).resolve()), False)
        if all(t in own.all_tasks for t in tasks):
            return own
    return _cached_manager(str(Path(include_path).resolve()) if include_path else None, True)


@functools.lru_cache(maxsize=8)
def _cached_manager(include_path: str | None, include_defaults: bool):
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=include_path, include_defaults=include_defaults)


def check_tasks(manager, tasks: list[str]) -> None:
    """Every task known to lm-eval and its dataset loadable; else ValueError naming the task and the fix."""
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:
        raise ValueError(f"unknown lm-eval task(s) {', '.join(unknown)}: check the spelling (`lm_eval ls tasks` "
                         "lists them), or pass --include-path DIR with the task's YAML file")
    for task in tasks:
        try:
            if hasattr(manager, "load"):  # lm-eval >= 0.4.10; get_task_dict is deprecated there
                manager.load([task])
            else:
                from lm_eval.tasks import get_task_dict

                get_task_dict([task], manager)
        except Exception as error:  # noqa: BLE001 - datasets/hub raise many types; all mean "no data"
            reason = str(error).strip().splitlines()[0][:300] if str(error).strip() else type(error).__name__
            raise ValueError(
                f"task {task}: its dataset could not be loaded ({type(error).__name__}: {reason}). If it lives "
                "on the Hugging Face Hub, run once where the hub is reachable (HF_DATASETS_OFFLINE unset) so it "
                "is cached, or point a local task YAML at the files (dataset_path: json, dataset_kwargs: "
                "{data_files: ...}) and pass --include-path DIR") from None


def _is_checkpoint(path: Path) -> bool:
    from pretrain.evaluation.scorer_loading import is_megatron_checkpoint

    return is_megatron_checkpoint(path)


def _scaled_factor(kind: str | None, factor: float | None, context_length: int | None, window: int) -> float | None:
    """--factor, else context_length / window (as `eval run` does with L_eval / w)."""
    if kind in (None, "none") or factor is not None:
        return factor
    if context_length is None:
        raise ValueError(f"--rope-scaling {kind} needs --factor F or --context-length L (factor L / {window})")
    return context_length / window


@contextlib.contextmanager
def hf_model_dir(source: str | Path, *, tokenizer: str | None = None, rope_scaling: str | None = None,
                 factor: float | None = None, context_length: int | None = None,
                 train_window: int | None = None) -> Iterator[tuple[Path, dict]]:
    """An HF directory lm-eval can load for `source`, and what was done to it; temporary parts removed after."""
    path = Path(source)
    if not path.exists():
        raise FileNotFoundError(f"{source}: no such checkpoint or model directory")
    with tempfile.TemporaryDirectory(prefix="downstream-") as tmp:
        if _is_checkpoint(path):
            from pretrain.hf.export import export_checkpoint
            from pretrain.trainer.checkpoint import read_train_state, resolve

            record = read_train_state(path)
            config = record["config"]
            window = int(config["model"]["seq_length"])
            rfs = (config.get("positions") or {}).get("strategy") == "rfs"
            out = export_checkpoint(path, Path(tmp) / "hf", tokenizer=tokenizer, rope_scaling=rope_scaling,
                                    factor=_scaled_factor(rope_scaling, factor, context_length, window),
                                    eval_length=context_length if rfs else None)
            checkpoint = resolve(path)
            yield out, {"kind": "megatron", "checkpoint": str(checkpoint), "iteration": record.get("iteration"),
                        "name": config.get("name"), "train_window": window,
                        "strategy": (config.get("positions") or {}).get("strategy"),
                        "rope_scaling": json.loads((out / "config.json").read_text()).get("rope_scaling")}
            return
        if not (path / "config.json").is_file():
            raise ValueError(f"{source}: neither a Megatron checkpoint nor an HF model directory (no config.json)")
        if tokenizer is not None:
            raise ValueError("--tokenizer is for Megatron checkpoints; an HF directory brings its own tokenizer")
        info = {"kind": "hf", "name": path.name}
        if rope_scaling in (None, "none"):
            if factor is not None:
                raise ValueError("--factor needs --rope-scaling pi|ntk|dynamic_ntk|yarn|llama3")
            yield path, info
            return
        yield _rescaled_copy(path, Path(tmp) / "hf", rope_scaling, factor, context_length, train_window), info


def _rescaled_copy(source: Path, target: Path, kind: str, factor: float | None, context_length: int | None,
                   train_window: int | None) -> Path:
    """`source` with config.json's RoPE fields rewritten for `kind` (the export's fields); other files linked."""
    from megatron_ext.positions import RopeScaling
    from pretrain.hf.rope import hf_rope_fields, rope_from_hf_config

    config = json.loads((source / "config.json").read_text())
    theta, existing = rope_from_hf_config(config.get)
    if existing not in ("none", "default"):
        raise ValueError(f"{source} already ships RoPE scaling {existing!r}; drop --rope-scaling, or start "
                         "from a directory without it")
    # Our exports announce the served context in max_position_embeddings (pretrain.hf.context), the window apart.
    window = int(train_window or (config.get("posaug_training") or {}).get("train_seq_length")
                 or config.get("max_position_embeddings") or 0)
    if window <= 0:
        raise ValueError(f"{source}: config.json has no max_position_embeddings; pass --train-window")
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    rotary_dim = int(head_dim * config.get("partial_rotary_factor", 1.0))
    model = SimpleNamespace(rotary_base=theta, seq_length=window, rotary_dim=rotary_dim)
    factor = _scaled_factor(kind, factor, context_length, window)
    if factor is None or not factor >= 1:
        raise ValueError(f"--rope-scaling {kind} needs --factor >= 1 (got {factor})")
    config.update(hf_rope_fields(model, RopeScaling(kind=kind, factor=float(factor),
                                                    original_max_position_embeddings=window)))
    target.mkdir(parents=True)
    for item in source.iterdir():
        if item.name != "config.json":
            os.symlink(item.resolve(), target / item.name)
    (target / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return target


def results_path(out: Path, tasks: list[str], num_fewshot: int | None, limit: float | None,
                 context_length: int | None, rope_scaling: str | None, factor: float | None) -> Path:
    """lm-eval results file for one request, named by what changes its numbers."""
    parts = ["+".join(tasks), "default-shot" if num_fewshot is None else f"{num_fewshot}shot"]
    if limit is not None:
        parts.append(f"limit{limit:g}")
    if context_length is not None:
        parts.append(f"ctx{context_length}")
    if rope_scaling not in (None, "none"):
        parts.append(rope_scaling + ("" if factor is None else f"{factor:g}"))
    name = re.sub(r"[^A-Za-z0-9_.+=-]", "_", "_".join(parts))[:200]
    return out / f"lm_eval_{name}.json"


def default_out(source: str | Path) -> Path:
    """<run dir>/downstream for a checkpoint (run dir or iter_*), <dir>/downstream for an HF directory."""
    path = Path(source)
    if _is_checkpoint(path):
        from pretrain.trainer.checkpoint import resolve

        return resolve(path).parent / RESULTS_DIR
    return path / RESULTS_DIR


def evaluate_downstream(source: str | Path, tasks: list[str], *, num_fewshot: int | None = None,
                        limit: float | None = None, context_length: int | None = None,
                        rope_scaling: str | None = None, factor: float | None = None,
                        include_path: str | None = None, tokenizer: str | None = None,
                        train_window: int | None = None, batch_size: int | str = 8, device: str = "cpu",
                        log_samples: bool = False, out: str | Path | None = None) -> tuple[dict, Path]:
    """Run lm-eval on a checkpoint or HF directory; returns (lm-eval's results dict, the JSON file written)."""
    lm_eval = import_lm_eval()
    from lm_eval.models.huggingface import HFLM
    from lm_eval.utils import handle_non_serializable

    from pretrain.faults import write_text_atomic

    manager = task_manager(include_path, tasks)
    check_tasks(manager, tasks)
    out_dir = Path(out) if out is not None else default_out(source)
    with hf_model_dir(source, tokenizer=tokenizer, rope_scaling=rope_scaling, factor=factor,
                      context_length=context_length, train_window=train_window) as (model_dir, info):
        model = HFLM(pretrained=str(model_dir), dtype="float32", device=device, batch_size=batch_size,
                     max_length=context_length)
        results = lm_eval.simple_evaluate(model=model, tasks=tasks, num_fewshot=num_fewshot, limit=limit,
                                          task_manager=manager, log_samples=log_samples)
    samples = results.pop("samples", None)
    results["pretrain"] = dict(info, source=str(source), tasks=tasks, num_fewshot=num_fewshot, limit=limit,
                               context_length=context_length, max_length=model.max_length,
                               requested_rope_scaling=rope_scaling, factor=factor,
                               created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    path = results_path(out_dir, tasks, num_fewshot, limit, context_length, rope_scaling, factor)
    write_text_atomic(path, json.dumps(results, indent=2, default=handle_non_serializable, ensure_ascii=False),
                      what="lm-eval results", elsewhere="pass an --output on a larger disk", then="rerun the same command")
    if samples is not None:
        results["samples"] = samples
    return results, path


def results_table(results: dict) -> str:
    """lm-eval's own console table(s) for a results dict."""
    from lm_eval.utils import make_table

    table = make_table(results)
    if results.get("groups"):
        table += "\n" + make_table(results, "groups")
    return table


def task_scores(results: dict) -> dict[str, dict]:
    """{task: {metric: value, metric_stderr: stderr, 'n-shot': k, 'samples': n}} from a results dict (filter 'none')."""
    scores: dict[str, dict] = {}
    for task, entries in (results.get("results") or {}).items():
        row: dict = {}
        for key, value in entries.items():
            metric, _, filt = key.partition(",")
            if not filt:
                continue
            name = metric if filt == "none" else f"{metric},{filt}"
            row[name] = value if isinstance(value, (int, float)) else None
        row["n-shot"] = (results.get("n-shot") or {}).get(task)
        row["samples"] = ((results.get("n-samples") or {}).get(task) or {}).get("effective")
        scores[task] = row
    return scores


def run_cli(args) -> int:
    """`eval downstream`: evaluate, write lm-eval's results JSON, end with lm-eval's own table."""
    limit = None if args.limit is None else (int(args.limit) if args.limit >= 1 else args.limit)
    results, path = evaluate_downstream(
        args.model, args.tasks, num_fewshot=args.num_fewshot, limit=limit, context_length=args.context_length,
        rope_scaling=args.rope_scaling, factor=args.factor, include_path=args.include_path,
        tokenizer=args.tokenizer, train_window=args.train_window, batch_size=args.batch_size, device=args.device,
        out=args.out)
    print(f"wrote {path}")
    print(results_table(results), end="")
    return 0
