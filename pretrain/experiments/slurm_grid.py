"""`python -m pretrain reproduce --slurm`: a whole grid of runs as SLURM jobs, from shards to report.

One command plans every run of the grid (memory per GPU, wall clock and GPU-hours: pretrain.plan), refuses
the grid before any submission when a run cannot fit, then submits it through the existing launchers,
chained with `sbatch --dependency`, so it runs to its report without a person:

    data job (only when the shards are missing)
      └─ afterok ─▶ training: one job array per size × method (array task i = seed i of SEEDS)
                      └─ afterok:<array>_<i> ─▶ one evaluation job per run (the baseline's also scores
                                                 its inference-time PI / NTK / YaRN rows)
                                                  └─ afterany ─▶ the report job (whatever finished;
                                                                 missing runs listed)

State lives in files: run directories (checkpoints), evaluation records, and OUT/grid.json (the grid and
the job ids it submitted); `squeue` says which of those jobs are still queued or running. A rerun
therefore submits exactly what is neither finished nor in flight. Plain sbatch dependencies rather than
NeMo-Run or submitit: slurm/README.md ("A whole grid") says why.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from data_prep.errors import OutputError, write_text_atomic
from pretrain.experiments.presets import INFERENCE, PRESETS, Preset
from pretrain.table import EXTRAPOLATION, PAPER_VOCAB, PAPER_WINDOW, SHIPPED_METHODS, SIZES, TABLE1_SIZES

ROOT = Path(__file__).resolve().parents[2]
GRID_FILE = "grid.json"
PAPER = "paper"
# The paper's Table 2 grid: every Table 1 size x the shipped methods, n = 3 seeds, evaluated at 16K
# (8 x w) on 20 spans with G(C) over a 512-token window, plus the baseline under PI / NTK / YaRN (Table 4).
PAPER_SEEDS = (42, 137, 2024)
PAPER_EVAL_LENGTH = EXTRAPOLATION * PAPER_WINDOW
PAPER_SPANS = 20
PAPER_GAIN_WINDOW = 512
# Resources of the jobs that are not training: the launchers' #SBATCH lines cover training.
EVAL_RESOURCES = {"gpu": ["--gpus-per-node=1", "--cpus-per-task=8", "--time=04:00:00"],
                  "cpu": ["--cpus-per-task=1", "--time=60"]}
REPORT_RESOURCES = ["--cpus-per-task=1", "--time=30"]
# CPU presets train on CPU nodes: one task, no GPU (common.sh then switches to the local implementation).
CPU_TRAIN_RESOURCES = ["--ntasks-per-node=1", "--gpus-per-node=0", "--cpus-per-task=1", "--time=60"]
CPU_LAUNCHER_SIZE = "10m"  # the launcher (1 node x 1 GPU defaults) a CPU preset's runs go through, with CONFIG=
JOB_PREFIX = "grid-"  # of every job name the grid submits
LIVE_STATES = ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED")


def _log(message: str) -> None:
    print(f"[grid] {message}", flush=True)


@dataclass(frozen=True)
class Spec:
    """One grid: preset, sizes × methods × seeds, where its data and outputs live, and how to plan it."""

    preset: str
    out: str
    sizes: tuple[str, ...]
    methods: tuple[str, ...]
    seeds: tuple[int, ...]
    data_prefix: str
    gpu: str
    sets: tuple[str, ...] = ()
    corpus: str | None = None
    tokenizer: str | None = None
    sbatch: tuple[str, ...] = ()
    mfu: float | None = None
    nodes: int | None = None  # of every training job (None: the launcher's; CPU presets 1)

    @property
    def cpu(self) -> bool:
        """True for the CPU presets (trained on CPU nodes, one config per method written by us)."""
        return self.preset != PAPER

    def runs(self) -> list[tuple[str, str, int]]:
        """(size, method, seed) of every run, size-major."""
        return [(size, method, seed) for size in self.sizes for method in self.methods for seed in self.seeds]

    def to_json(self) -> dict:
        """JSON-able form (grid.json)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, raw: dict) -> "Spec":
        """Inverse of to_json."""
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()})


def run_name(size: str, method: str, seed: int) -> str:
    """The run directory's name: the launchers' `<size>_<method>_seed<seed>`."""
    return f"{size}_{method}_seed{seed}"


def parse_run_name(name: str) -> tuple[str, str, int]:
    """Inverse of run_name."""
    match = re.fullmatch(r"(.+?)_(.+)_seed(\d+)", name)
    if not match:
        raise ValueError(f"run {name!r}: expected <size>_<method>_seed<seed>")
    return match.group(1), match.group(2), int(match.group(3))


def size_preset(spec: Spec, size: str) -> Preset:
    """The reproduction Preset of one size of the grid (the report and the evaluation read it)."""
    if spec.cpu:
        return dataclasses.replace(PRESETS[spec.preset], methods=spec.methods)
    from pretrain.evaluation.metrics import default_in_start

    row = SIZES[size]
    return Preset(model=size, window=PAPER_WINDOW, vocab_size=PAPER_VOCAB, train_tokens=row.train_tokens,
                  global_batch_size=row.global_batch_size, micro_batch_size=row.micro_batch_size, lr=row.lr,
                  eval_length=PAPER_EVAL_LENGTH, num_spans=PAPER_SPANS, in_dist_start=default_in_start(PAPER_WINDOW),
                  gain_window=PAPER_GAIN_WINDOW, corpus_bytes=0, valid_fraction=0.0, gain_spans=PAPER_SPANS,
                  methods=spec.methods)


def train_config(spec: Spec, size: str, method: str):
    """The TrainConfig every seed of (size, method) trains (the launcher adds seed, name and run dir)."""
    from pretrain.trainer import config as config_module

    if spec.cpu:
        from pretrain.experiments.reproduce import train_config as cpu_config

        base = cpu_config(size_preset(spec, size), method, spec.seeds[0], spec.data_prefix,
                          Path(spec.out) / "runs" / f"{size}_{method}")
        raw = config_module.to_dict(base)
        return config_module.from_dict(config_module.apply_overrides(raw, list(spec.sets)))
    return config_module.load(config_module.CONFIG_DIR / f"{size}_{method}.yaml",
                              [f"data.data_path={spec.data_prefix}", *spec.sets])


# ---- the plan ---------------------------------------------------------------------------------------------

def plan_grid(spec: Spec) -> tuple[str, list[str]]:
    """The grid's plan as text (per size × method and in total) and the one-line refusals of runs that do not fit."""
    from pretrain.plan.hardware import CONTEXT_ALLOWANCE_BYTES, GIB
    from pretrain.plan.layout import plan_for
    from pretrain.plan.report import duration, gib, one_line_refusal, parse_slurm_time

    args = argparse.Namespace(nodes=spec.nodes, gpus_per_node=None, dp=None, gpu=spec.gpu, mfu=spec.mfu,
                              allowance_gib=CONTEXT_ALLOWANCE_BYTES / GIB)
    n = len(spec.seeds)
    rows = [f"{'run':<22}{'GPUs':>6}{'peak/GPU':>13}{'fits':>6}{'steps':>9}{'wall/run':>13}{'GPU-h/run':>11}"
            f"{'seeds':>7}{'GPU-h':>10}{'jobs/run':>10}"]
    total, longest, serial, refusals, gpu_label = 0.0, 0.0, 0.0, [], spec.gpu
    for size in spec.sizes:
        for method in spec.methods:
            name = f"{size}_{method}"
            try:
                plan = plan_for(train_config(spec, size, method), args)
            except ValueError as error:
                refusals.append(f"{name}: {error}")
                continue
            gpu_label = plan.gpu_label
            if not plan.fits:
                refusals.append(one_line_refusal(plan).replace(plan.name, name, 1))
            total += plan.gpu_hours * n
            longest, serial = max(longest, plan.wall_seconds), serial + plan.wall_seconds * n
            jobs = "-"
            slurm = SIZES[size].slurm
            if slurm is not None and not spec.cpu:  # requeued jobs a run needs within the launcher's --time
                jobs = str(math.ceil(plan.wall_seconds / max(parse_slurm_time(slurm.time) - slurm.usr1_lead_s, 1)))
            rows.append(f"{name:<22}{plan.layout.world:>6}{gib(plan.worst.peak):>13}{'yes' if plan.fits else 'NO':>6}"
                        f"{plan.iterations:>9,}{duration(plan.wall_seconds):>13}{plan.gpu_hours:>11,.1f}{n:>7}"
                        f"{plan.gpu_hours * n:>10,.1f}{jobs:>10}")
    rows.append(f"{'total':<22}{'':>65}{len(spec.runs()):>7}{total:>10,.1f}")
    mfu = f"MFU {spec.mfu:.0%}" if spec.mfu else "the GPU's published Megatron MFU"
    where = "CPU nodes (the plan is what the same runs would take on the GPU)" if spec.cpu else "the launchers' nodes"
    text = "\n".join([f"plan: grid `{spec.preset}` on {gpu_label}, {mfu}, runs on {where}", *rows,
                      f"wall clock: {duration(longest)} when every run has its GPUs at once, "
                      f"{duration(serial)} one run at a time"])
    return text, refusals


# ---- SLURM ------------------------------------------------------------------------------------------------

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


# ---- state ------------------------------------------------------------------------------------------------

def load_state(out: Path) -> dict:
    """OUT/grid.json: the spec and the jobs submitted so far ({} when none)."""
    path = out / GRID_FILE
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except ValueError as error:
        raise ValueError(f"{path} is damaged ({error}): move it away and rerun (finished runs are kept)") from None


def save_state(out: Path, state: dict) -> None:
    """Write OUT/grid.json atomically."""
    write_text_atomic(out / GRID_FILE, json.dumps(state, indent=1), what="grid state",
                      elsewhere="pass an --output on a larger disk", then="rerun the same command")


def eval_labels(method: str) -> list[str]:
    """The evaluation records one run's evaluation job writes (the baseline's also the inference-time rows)."""
    return [method, *(INFERENCE if method == "baseline" else ())]


def eval_path(spec: Spec, size: str, label: str, seed: int) -> Path:
    """Where reproduce.evaluate_runs caches one record (under the size's results directory)."""
    return Path(spec.out) / "results" / size / "eval" / f"{label}_s{seed}.json"


def evaluated(spec: Spec, size: str, method: str, seed: int) -> bool:
    """True when every record of the run exists."""
    preset_inference = size_preset(spec, size).inference
    return all(eval_path(spec, size, label, seed).is_file() for label in eval_labels(method)
               if label == method or label in preset_inference)


def train_finished(spec: Spec, size: str, method: str, seed: int, iters: int | None = None) -> bool:
    """True when the run's newest complete checkpoint is its last iteration."""
    from pretrain.experiments.runs import inspect_run

    run_dir = Path(spec.out) / "runs" / run_name(size, method, seed)
    return (run_dir / "config.yaml").is_file() and inspect_run(run_dir).finished


def shards_ready(prefix: str) -> bool:
    """True when data_prep's manifest for `prefix` exists (data_prep verifies its shards itself)."""
    from data_prep.manifest import manifest_path

    return Path(manifest_path(prefix)).is_file()


# ---- submission -------------------------------------------------------------------------------------------

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
            data_env = {**env, "INPUT": spec.corpus, "TOKENIZER": spec.tokenizer, "OUTPUT_PREFIX": spec.data_prefix}
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
                if spec.cpu:
                    train_env["CONFIG"] = str(out / "configs" / f"{group}.yaml")
                    train_env["RUN_NAME"] = f"{group}_seed{{seed}}"
                    options += CPU_TRAIN_RESOURCES
                    launcher = ROOT / "slurm" / f"pretrain_{CPU_LAUNCHER_SIZE}_{method}.sh"
                    if not launcher.is_file():  # a method without a shipped launcher: its config says it all
                        launcher = ROOT / "slurm" / f"pretrain_{CPU_LAUNCHER_SIZE}_baseline.sh"
                    if not dry_run:
                        from pretrain.trainer import config as config_module

                        write_text_atomic(Path(train_env["CONFIG"]),
                                          config_module.dump(train_config(spec, size, method)), what="run config",
                                          elsewhere="pass an --output on a larger disk", then="rerun")
                else:
                    train_env["DATA_PREFIX"] = spec.data_prefix
                    launcher = ROOT / "slurm" / f"pretrain_{size}_{method}.sh"
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
                           *EVAL_RESOURCES["cpu" if spec.cpu else "gpu"]]
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


# ---- status -----------------------------------------------------------------------------------------------

def _last_loss(out: Path, group: str, task: str | None) -> str:
    if not task or "_" not in task:
        return "-"
    log = out / "logs" / f"train-{group}-{task}.out"
    try:
        found = re.findall(r"step \d+/\d+ \| loss (\S+)", log.read_text(errors="replace"))
    except OSError:
        return "-"
    return found[-1] if found else "-"


def status(spec: Spec, live: dict[str, str]) -> str:
    """The grid as a table: every run's state, job, step, last loss and evaluation; then the report."""
    from pretrain.experiments.runs import inspect_run

    out = Path(spec.out)
    jobs = load_state(out).get("jobs", {"train": {}, "eval": {}})
    header = ("run", "state", "job", "step", "last loss", "evaluated")
    rows, counts = [], {}
    for size, method, seed in spec.runs():
        name = run_name(size, method, seed)
        run_dir = out / "runs" / name
        job = jobs["train"].get(name)
        run = inspect_run(run_dir) if (run_dir / "config.yaml").is_file() else None
        if run is not None and run.finished:
            state = "finished"
        elif job in live:
            state = live[job].lower()
        elif run is not None:
            state = run.state if run.state != "running" else "failed"  # not in the queue: it cannot be running
        else:
            state = "not submitted" if job is None else "failed"
        step = f"{run.iteration}/{run.train_iters}" if run is not None else "-"
        eval_job = jobs["eval"].get(name)
        done = evaluated(spec, size, method, seed)
        evaluation = "yes" if done else (f"{live[eval_job].lower()} ({eval_job})" if eval_job in live else "no")
        rows.append((name, state, job or "-", step, _last_loss(out, f"{size}_{method}", job), evaluation))
        counts[state] = counts.get(state, 0) + 1
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in [header, *rows]]
    report, report_job = out / "report.md", jobs.get("report")
    lines.append(", ".join(f"{n} {s}" for s, n in counts.items()) + f" ({len(rows)} runs)")
    lines.append(f"report: {report}" + ("" if report.is_file() else " (not written yet)")
                 + (f"; report job {report_job} {live[report_job].lower()}" if report_job in live else ""))
    return "\n".join(lines)


# ---- stages (inside the jobs) -----------------------------------------------------------------------------

def stage_data(spec: Spec) -> None:
    """CPU presets: corpus → tokenizer → shards, as `reproduce` does in one process."""
    from pretrain.experiments.reproduce import prepare_data

    prefix = prepare_data(Path(spec.out), PRESETS[spec.preset], spec.corpus)
    if prefix != spec.data_prefix:
        raise RuntimeError(f"data written to {prefix}, but the grid trains on {spec.data_prefix}")


def stage_eval(spec: Spec, name: str) -> None:
    """One run's evaluation record(s), cached where the report reads them."""
    from pretrain.experiments.reproduce import evaluate_runs

    size, method, seed = parse_run_name(name)
    run_dir = Path(spec.out) / "runs" / name
    preset = size_preset(spec, size)
    evaluate_runs(Path(spec.out) / "results" / size, preset, {f"{method}_s{seed}": run_dir},
                  [seed] if method == "baseline" else [], spec.data_prefix)


def stage_report(spec: Spec) -> Path:
    """Per size the report `reproduce` writes, from what finished; OUT/report.md gathers them, missing runs named."""
    from pretrain.experiments.reproduce import summarise
    from pretrain.experiments.reproduce_report import write_report

    out = Path(spec.out)
    state = load_state(out)
    elapsed = time.time() - state.get("created", time.time())
    sections = [f"# Grid report — `reproduce --slurm --preset {spec.preset}`\n\n"
                f"Sizes {', '.join(spec.sizes)}; methods {', '.join(spec.methods)}; seeds "
                f"{', '.join(map(str, spec.seeds))}. Runs in `{out / 'runs'}`; `--status` shows the grid."]
    for size in spec.sizes:
        preset = size_preset(spec, size)
        records, missing = [], []
        for method in spec.methods:
            for seed in spec.seeds:
                for label in eval_labels(method):
                    if label != method and label not in preset.inference:
                        continue
                    path = eval_path(spec, size, label, seed)
                    if path.is_file():
                        records.append(json.loads(path.read_text()))
                    else:
                        missing.append(f"{label} seed {seed}" + ("" if label == method else
                                                                  f" (from {run_name(size, method, seed)})"))
        text = f"## {size}\n\n"
        if records:
            directory = out / "results" / size
            seeds = sorted({r["seed"] for r in records})
            write_report(directory, spec.preset, preset, summarise(records, preset), records, seeds, elapsed)
            body = (directory / "report.md").read_text().split("\n", 1)[1].strip()
            text += re.sub(r"\]\(([^)/]+\.png)\)", rf"](results/{size}/\1)", body)
        else:
            text += "No run of this size has been evaluated yet."
        text += ("\n\n**Missing** (not trained or not evaluated yet; rerun the same command to resubmit): "
                 + ", ".join(missing) + "." if missing else "\n\nNo run missing.")
        sections.append(text)
    write_text_atomic(out / "report.md", "\n\n".join(sections) + "\n", what="grid report",
                      elsewhere="pass an --output on a larger disk", then="rerun the report stage")
    return out / "report.md"


# ---- CLI --------------------------------------------------------------------------------------------------

def _split(values: list[str] | None) -> list[str]:
    return [v for item in values or [] for v in item.replace(",", " ").split()]


def make_spec(args: argparse.Namespace) -> Spec:
    """The grid the arguments ask for; ValueError (one line naming the flag) when they cannot make one."""
    from pretrain.plan.hardware import GPUS

    if args.preset == PAPER:
        sizes_all, methods_all, seeds = TABLE1_SIZES, SHIPPED_METHODS, list(PAPER_SEEDS)
    elif args.preset in PRESETS:
        sizes_all, methods_all, seeds = (PRESETS[args.preset].model,), PRESETS[args.preset].methods, [42]
    else:
        raise ValueError(f"--preset {args.preset}: choose one of {[PAPER, *sorted(PRESETS)]}")
    sizes = _split(args.sizes) or list(sizes_all)
    bad = [s for s in sizes if s not in sizes_all]
    if bad:
        raise ValueError(f"--sizes {' '.join(bad)}: the {args.preset} grid has sizes {', '.join(sizes_all)}")
    methods = _split(args.methods) or list(methods_all)
    bad = [m for m in methods if m not in methods_all]
    if bad:
        raise ValueError(f"--methods {' '.join(bad)}: the {args.preset} grid has methods {', '.join(methods_all)}")
    methods = ["baseline", *[m for m in methods_all if m in methods and m != "baseline"]]  # the paired reference
    if args.seeds:
        try:
            seeds = [int(s) for s in _split(args.seeds)]
        except ValueError:
            raise ValueError(f"--seeds {' '.join(args.seeds)}: expected seed values, e.g. --seeds 42 137 2024") \
                from None
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"--seeds {' '.join(args.seeds)}: a seed appears twice")
    if args.gpu not in GPUS:
        raise ValueError(f"--gpu {args.gpu}: choose one of {', '.join(sorted(GPUS))}")
    if args.nodes is not None and args.nodes < 1:
        raise ValueError(f"--nodes {args.nodes}: expected at least 1")
    if args.mfu is not None and not 0 < args.mfu <= 1:
        raise ValueError(f"--mfu {args.mfu}: expected a fraction in (0, 1], e.g. --mfu 0.3")
    out = Path(args.output).resolve()
    if args.preset == PAPER:
        if not args.data_prefix:
            raise ValueError("--preset paper needs --data-prefix: the data_prep --output-prefix of the shards "
                             "(with --corpus and --tokenizer when they still have to be built)")
        prefix = str(Path(args.data_prefix).resolve())
        if not shards_ready(prefix) and not (args.corpus and args.tokenizer):
            raise ValueError(f"no shards at --data-prefix {prefix} (no manifest): pass --corpus and --tokenizer "
                             "to build them in a data_prep job first, or the prefix of existing shards")
    else:
        if args.data_prefix or args.tokenizer:
            raise ValueError(f"--preset {args.preset} builds its own data under --output (its tokenizer too): "
                             "drop --data-prefix/--tokenizer, or use --preset paper")
        prefix = str(out / "data" / "shards" / "corpus")
    return Spec(preset=args.preset, out=str(out), sizes=tuple(sizes), methods=tuple(methods), seeds=tuple(seeds),
                data_prefix=prefix, gpu=args.gpu, sets=tuple(args.set), corpus=args.corpus,
                tokenizer=args.tokenizer, sbatch=tuple(shlex.split(args.sbatch or "")), mfu=args.mfu,
                nodes=args.nodes)


def parser() -> argparse.ArgumentParser:
    """`reproduce --slurm`'s arguments."""
    from pretrain.plan.hardware import DEFAULT_GPU

    p = argparse.ArgumentParser(prog="python -m pretrain reproduce --slurm",
                                description="submit a whole grid of runs to SLURM: plan, train, evaluate, report")
    p.add_argument("--slurm", action="store_true", help="(this mode)")
    p.add_argument("--preset", default=PAPER, help=f"{PAPER} (Table 2: 5 sizes x 5 methods x 3 seeds) or a CPU "
                   f"preset ({', '.join(sorted(PRESETS))})")
    p.add_argument("--output", default="reproduce_grid", help="grid directory: runs, logs, results, report.md")
    p.add_argument("--sizes", nargs="+", help="a subset of the preset's sizes")
    p.add_argument("--methods", nargs="+", help="a subset of the preset's methods (the baseline is always kept)")
    p.add_argument("--seeds", nargs="+", help="seed values (default: 42 137 2024 for paper, 42 for CPU presets)")
    p.add_argument("--gpu", default=DEFAULT_GPU, help="GPU model the plan checks memory and cost against")
    p.add_argument("--mfu", type=float, help="MFU the plan assumes (default: the GPU's published one)")
    p.add_argument("--nodes", type=int, help="nodes of every training job (default: each launcher's; CPU presets 1)")
    p.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE", help="overrides for every training run")
    p.add_argument("--data-prefix", help="paper: data_prep --output-prefix of the shards")
    p.add_argument("--corpus", help="paper: corpus for the data_prep job (when the shards are missing); CPU "
                   "presets: a corpus instead of the embedded one")
    p.add_argument("--tokenizer", help="paper: tokenizer for the data_prep job")
    p.add_argument("--sbatch", help="extra sbatch options for every job, e.g. \"--partition=gpu --account=x\"")
    p.add_argument("--dry-run", action="store_true", help="print the plan and every sbatch command; submit nothing")
    p.add_argument("--status", action="store_true", help="show the grid in --output: every run's state, job, step, "
                   "last loss, evaluation, and the report")
    p.add_argument("--slurm-stage", choices=("data", "eval", "report"), help=argparse.SUPPRESS)
    p.add_argument("--run", help=argparse.SUPPRESS)
    return p


def _stage(args: argparse.Namespace) -> int:
    out = Path(args.output).resolve()
    raw = load_state(out).get("spec")
    if raw is None:
        raise ValueError(f"no grid at {out} ({GRID_FILE} missing)")
    spec = Spec.from_json(raw)
    if args.slurm_stage == "data":
        stage_data(spec)
    elif args.slurm_stage == "eval":
        stage_eval(spec, args.run)
    else:
        _log(f"report: {stage_report(spec)}")
    return 0


def main(argv: list[str]) -> int:
    """CLI of `python -m pretrain reproduce --slurm` (and of its jobs' stages)."""
    args = parser().parse_args(argv)
    try:
        if args.slurm_stage:
            return _stage(args)
        if args.status:  # the grid as submitted (grid.json), whatever else the command line says
            out = Path(args.output).resolve()
            raw = load_state(out).get("spec")
            if raw is None:
                raise ValueError(f"no grid at {out}: run the same command without --status to submit it")
            print(status(Spec.from_json(raw), Slurm(dry_run=False).live()))
            return 0
        spec = make_spec(args)
        text, refusals = plan_grid(spec)
        print(text, flush=True)
        if refusals:
            more = f" (and {len(refusals) - 1} more run(s) of the grid)" if len(refusals) > 1 else ""
            print(f"error: the grid does not fit, nothing was submitted: {refusals[0]}{more}", file=sys.stderr)
            return 2
        commands, state = submit(spec, args.dry_run)
        if args.dry_run:
            print(f"# dry run: {len(commands)} sbatch command(s), nothing submitted\nset -e")
            print("\n".join(commands))
            return 0
        if not commands:
            _log(f"nothing to submit: every run is finished and evaluated; report: {Path(spec.out) / 'report.md'}")
            return 0
        for line in commands:
            _log(f"submitted {line}")
        _log(f"{len(commands)} job(s) submitted; `--status` shows the grid; report: {Path(spec.out) / 'report.md'}")
        return 0
    except (ValueError, OutputError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except RuntimeError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
