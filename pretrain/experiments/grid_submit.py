"""Submission of a `reproduce --slurm` grid: sbatch chains (data -> train arrays -> eval -> report).

Only what is neither finished nor in flight (squeue) is submitted; grid.json records every job id, also
when an sbatch fails half-way, so a rerun submits exactly the rest.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

from pretrain.faults import write_text_atomic
from pretrain.experiments.grid_plan import (CPU_TRAIN_RESOURCES, EVAL_RESOURCES, GRID_FILE,
                                            JOB_PREFIX, LIVE_STATES, REPORT_RESOURCES, ROOT, Spec, eval_path, evaluated,
                                            load_state, run_name, save_state, shards_ready, train_config,
                                            train_finished)

class Slurm:
    """sbatch and squeue, or (dry run) the commands printed as a runnable script with job ids in variables."""

    def __init__(self, dry_run: bool, extra: tuple[str, ...] = ()) -> None:
        self.dry_run = dry_run
        self.extra = list(extra)  # the user's --sbatch options: last, so they win over the grid's defaults
        self.commands: list[str] = []

    def submit(self, var: str, env: dict[str, str], options: list[str], command: list[str]) -> str:
        """Submit one job (or print it); returns its id (a `$VAR` reference in a dry run)."""
        args = [*options, *self.extra, *command]
        line = " ".join([*(f"{k}={shlex.quote(v)}" for k, v in env.items()), "sbatch", "--parsable",
                         *map(_quote_dependency, args)])
        if self.dry_run:
            self.commands.append(f"{var}=$({line})")
            return f"${{{var}}}"
        proc = subprocess.run(["sbatch", "--parsable", *args], env={**os.environ, **env}, capture_output=True,
                              text=True, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"sbatch failed ({proc.stderr.strip() or proc.stdout.strip()}): {line}")
        job = proc.stdout.strip().split(";")[0]
        self.commands.append(f"{var}={job}  # {line}")
        return job

    def live(self) -> dict[str, str]:
        """Queued/running job (and array task) ids → state, from squeue; {} in a dry run without SLURM."""
        try:
            proc = subprocess.run(["squeue", "--me", "-h", "-r", "-o", "%i %T %j"], capture_output=True, text=True,
                                  timeout=60)
        except FileNotFoundError:
            if self.dry_run:
                return {}
            raise RuntimeError("squeue not found: run this on a SLURM login node (or pass --dry-run)") from None
        if proc.returncode != 0:
            if self.dry_run:
                return {}
            raise RuntimeError(f"squeue failed: {proc.stderr.strip()} (is SLURM_CONF right?)")
        rows = (line.split(maxsplit=2) for line in proc.stdout.splitlines() if line.strip())
        # only our jobs' names: an id recorded in grid.json may be reused after the controller's state is reset
        return {job: state for job, state, name in rows if state in LIVE_STATES and name.startswith(JOB_PREFIX)}


def _quote_dependency(arg: str) -> str:
    # keep ${VAR} references expandable in the printed script
    return f'"{arg}"' if "${" in arg else shlex.quote(arg)


def _var(kind: str, name: str) -> str:
    return re.sub(r"\W", "_", f"{kind}_{name}").upper()


def _in_flight(job: str | None, live: dict[str, str]) -> bool:
    return job is not None and job in live


def _job_common(spec: Spec, name: str, log: str) -> list[str]:
    return [f"--job-name={JOB_PREFIX}{name}", f"--output={Path(spec.out) / 'logs' / log}"]


def _env(spec: Spec) -> dict[str, str]:
    """Variables every job gets (sbatch exports the submitting environment, so only what differs)."""
    return {"PYTHON": os.environ.get("PYTHON", sys.executable)}


def submit(spec: Spec, dry_run: bool) -> tuple[list[str], dict]:
    """Submit what is missing or failed; returns (the sbatch lines, the new state).

    grid.json is written even when an sbatch fails half-way, so the jobs already submitted are known
    to the rerun (which then submits only the rest).
    """
    out = Path(spec.out)
    slurm = Slurm(dry_run, spec.sbatch)
    state = load_state(out)
    state.setdefault("jobs", {"data": None, "train": {}, "eval": {}, "report": None})
    live = slurm.live()
    if not dry_run:  # the jobs read the spec: it is on disk before the first of them can start
        (out / "logs").mkdir(parents=True, exist_ok=True)
        state.setdefault("created", time.time())
        state["spec"] = spec.to_json()
        save_state(out, state)
    try:
        _submit(spec, slurm, state["jobs"], live)
    except RuntimeError as error:
        raise RuntimeError(f"{error}; {len(slurm.commands)} job(s) submitted before it are recorded in "
                           f"{out / GRID_FILE}: fix the cause and rerun the same command") from None
    finally:
        if not dry_run and slurm.commands:
            state.setdefault("submissions", []).append({"time": time.time(), "commands": slurm.commands})
            save_state(out, state)
    return slurm.commands, state


def _submit(spec: Spec, slurm: Slurm, jobs: dict, live: dict[str, str]) -> None:
    out = Path(spec.out)
    dry_run = slurm.dry_run
    env = _env(spec)
    stage = str(ROOT / "slurm" / "reproduce_stage.sh")

    data_dep = None
    if not shards_ready(spec.data_prefix):
        if _in_flight(jobs.get("data"), live):
            data_dep = jobs["data"]
        elif spec.cpu:
            data_dep = slurm.submit("DATA", env, [*_job_common(spec, "data", "data-%j.out"), *REPORT_RESOURCES],
                                    [stage, "data", spec.out])
        else:
            data_env = {**env, "INPUT": spec.corpus or "<pass --input>", "TOKENIZER": spec.tokenizer or "<pass --tokenizer>",
                        "DATA_PREFIX": spec.data_prefix}  # placeholders: a dry run before the data exists
            data_dep = slurm.submit("DATA", data_env, _job_common(spec, "data", "data-%j.out"),
                                    [str(ROOT / "slurm" / "data_prep.sh")])
        jobs["data"] = data_dep

    eval_deps: list[str] = []
    for size in spec.sizes:
        for method in spec.methods:
            todo = []
            for index, seed in enumerate(spec.seeds):
                name = run_name(size, method, seed)
                if not train_finished(spec, size, method, seed) and not _in_flight(jobs["train"].get(name), live):
                    todo.append((index, seed))
            if todo:
                group = f"{size}_{method}"
                train_env = {**env, "OUTPUT_DIR": str(out / "runs"), "SEEDS": " ".join(map(str, spec.seeds))}
                if spec.sets:
                    train_env["OVERRIDES"] = " ".join(spec.sets)
                options = [*_job_common(spec, f"train-{group}", f"train-{group}-%A_%a.out"),
                           f"--array={','.join(str(i) for i, _ in todo)}"]
                if spec.nodes or spec.cpu:
                    options.append(f"--nodes={spec.nodes or 1}")
                launcher = spec.launcher(size, method)
                if spec.cpu:
                    train_env["CONFIG"] = str(out / "configs" / f"{group}.yaml")
                    train_env["RUN_NAME"] = f"{group}_seed{{seed}}"
                    if not spec.on_gpu:  # a GPU preset keeps its launcher's #SBATCH GPUs and time
                        options += CPU_TRAIN_RESOURCES
                    if not dry_run:
                        from pretrain.trainer import config as config_module

                        write_text_atomic(Path(train_env["CONFIG"]),
                                          config_module.dump(train_config(spec, size, method)), what="run config",
                                          elsewhere="pass an --output on a larger disk", then="rerun")
                else:
                    train_env["DATA_PREFIX"] = spec.data_prefix
                    if spec.budget:
                        train_env["BUDGET"] = spec.budget
                if data_dep:
                    options += [f"--dependency=afterok:{data_dep}", "--kill-on-invalid-dep=yes"]
                array = slurm.submit(_var("train", group), train_env, options, [str(launcher)])
                for index, seed in todo:
                    jobs["train"][run_name(size, method, seed)] = f"{array}_{index}"
            for seed in spec.seeds:
                name = run_name(size, method, seed)
                if _in_flight(jobs["eval"].get(name), live):
                    eval_deps.append(jobs["eval"][name])
                    continue
                if evaluated(spec, size, method, seed):
                    continue
                options = [*_job_common(spec, f"eval-{name}", f"eval-{name}-%j.out"),
                           *EVAL_RESOURCES["gpu" if spec.on_gpu else "cpu"]]
                train_job = jobs["train"].get(name)
                if not train_finished(spec, size, method, seed) and train_job:
                    options += [f"--dependency=afterok:{train_job}", "--kill-on-invalid-dep=yes"]
                job = slurm.submit(_var("eval", name), env, options, [stage, "eval", spec.out, name])
                jobs["eval"][name] = job
                eval_deps.append(job)

    report = out / "report.md"
    fresh = report.is_file() and all(eval_path(spec, s, m, seed).stat().st_mtime <= report.stat().st_mtime
                                     for s, m, seed in spec.runs() if eval_path(spec, s, m, seed).is_file())
    submitted_now = len(slurm.commands) > 0
    if submitted_now or not (fresh or _in_flight(jobs.get("report"), live)):
        options = [*_job_common(spec, "report", "report-%j.out"), *REPORT_RESOURCES]
        if eval_deps:
            options.append("--dependency=afterany:" + ":".join(eval_deps))
        jobs["report"] = slurm.submit("REPORT", env, options, [stage, "report", spec.out])
