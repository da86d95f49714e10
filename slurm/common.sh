# Shared body of the slurm/pretrain_<size>_<method>.sh launchers; sourced (not run) by them after they
# set MODEL_SIZE, METHOD and LAUNCHER_FILE and found POSAUG_ROOT. See slurm/README.md for the whole
# story; the short version:
#
#   sbatch slurm/pretrain_113m_posaug.sh                       # one run, seed 42
#   sbatch --array=0-2 slurm/pretrain_113m_posaug.sh           # seeds 42, 137, 2024 (SEEDS)
#   DATA_PREFIX=/data/owt/owt sbatch slurm/pretrain_113m_posaug.sh
#   bash slurm/pretrain_113m_posaug.sh --dry-run               # print settings and the srun command
#
# Launch model: one srun task per GPU (not one torchrun per node). SLURM already starts, places, signals
# and cleans up one process per GPU; rank_env.sh maps SLURM_PROCID/SLURM_LOCALID/SLURM_NTASKS to
# RANK/LOCAL_RANK/WORLD_SIZE. The deciding reason is preemption: srun forwards SIGUSR1 straight to every
# trainer process, and srun's exit code is the trainer's (75 = "saved, requeue me"). torchrun's agent
# does not handle SIGUSR1 (its default action kills the agent, not the workers), turns SIGTERM into a
# worker shutdown with a 30 s SIGKILL deadline, and exits with its own code, which hides the requeue
# code. Rendezvous is the static env:// kind: MASTER_ADDR = first host of SLURM_JOB_NODELIST,
# MASTER_PORT derived from the job id (distinct for concurrent jobs and array tasks sharing a node).
#
# Preemption: `#SBATCH --signal=B:USR1@<s>` signals this batch shell <s> seconds before the time limit;
# the trap forwards it to srun, the trainer saves a checkpoint and exits 75, and this script runs
# `scontrol requeue $SLURM_JOB_ID`. The requeued job finds <run dir>/latest_checkpointed_iteration.txt
# and resumes. The run directory depends only on size, method and seed (never the job id), so a requeued
# job, a resubmitted job and an `--dependency=afterany:<jobid>` chain all continue the same run.

# ---- helpers ----------------------------------------------------------------------------------------
_log() { echo "[posaug-slurm] $*"; }
_die() { echo "[posaug-slurm] ERROR: $*" >&2; exit 2; }

# _sbatch_default OPTION: the value of `#SBATCH --OPTION=VALUE` in the launcher (for dry runs outside a
# job, where SLURM_* do not exist yet).
_sbatch_default() {
    sed -n "s/^#SBATCH --$1=\([^ ]*\).*/\1/p" "$LAUNCHER_FILE" | head -n1
}

# _config_value KEY: a scalar from the YAML config (`  KEY: value`), for printing and the DP check.
_config_value() {
    sed -n "s/^ *$1: *\([^ #]*\).*/\1/p" "$CONFIG" | head -n1
}

# ---- arguments --------------------------------------------------------------------------------------
# Launcher arguments (after `sbatch script.sh`): --dry-run/--test-only, and trainer overrides
# (`--set a.b=c d.e=f` or bare `a.b=c`), appended after OVERRIDES so they win.
DRY_RUN=${DRY_RUN:-0}
EXTRA_SETS=()
LAUNCHER_ARGS=("$@")  # the submit path hands these to sbatch unchanged
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run|--test-only) DRY_RUN=1 ;;
        --no-plan-check) PLAN_CHECK=0 ;;
        --set) ;;
        -h|--help) sed -n '2,/^set -euo/p' "$LAUNCHER_FILE" | grep '^#' | grep -v '^#SBATCH'; exit 0 ;;
        *=*) EXTRA_SETS+=("$1") ;;
        *) _die "unknown argument '$1' (expected --dry-run, --test-only, --no-plan-check or --set key=value ...)" ;;
    esac
    shift
done

IN_JOB=0
[ -n "${SLURM_JOB_ID:-}" ] && IN_JOB=1
# Outside a job and not a dry run: the submit path. Everything below is checked here, on the login node
# (config, data, tokenizer vs vocabulary, the plan's memory fit), and only then is this same launcher
# handed to sbatch with the same arguments (the environment travels with sbatch's default --export=ALL).
SUBMIT=0
if [ "$IN_JOB" = 0 ] && [ "$DRY_RUN" != 1 ]; then
    SUBMIT=1
fi

# ---- resolved settings (environment overrides, then #SBATCH/SLURM allocation, then defaults) --------
CONFIG=${CONFIG:-$POSAUG_ROOT/pretrain/configs/${MODEL_SIZE}_${METHOD}.yaml}
[ -f "$CONFIG" ] || _die "config $CONFIG not found"

# Seed: SEED wins; in a job array the task id indexes SEEDS (sbatch --array=0-2 -> 42 137 2024).
read -r -a _SEEDS <<<"${SEEDS:-42 137 2024}"
if [ -z "${SEED:-}" ]; then
    if [ -n "${SLURM_ARRAY_TASK_ID:-}" ]; then
        [ "$SLURM_ARRAY_TASK_ID" -lt "${#_SEEDS[@]}" ] \
            || _die "array task $SLURM_ARRAY_TASK_ID has no seed: SEEDS='${_SEEDS[*]}' (use --array=0-$(( ${#_SEEDS[@]} - 1 )))"
        SEED=${_SEEDS[$SLURM_ARRAY_TASK_ID]}
    else
        SEED=${_SEEDS[0]}
    fi
fi

OUTPUT_DIR=${OUTPUT_DIR:-$POSAUG_ROOT/runs}
RUN_NAME=${RUN_NAME:-${MODEL_SIZE}_${METHOD}_seed${SEED}}
RUN_NAME=${RUN_NAME//\{seed\}/$SEED}  # a pattern for every task of an array (reproduce --slurm)
RUN_DIR=${RUN_DIR:-$OUTPUT_DIR/$RUN_NAME}

# Python: an explicit PYTHON, else the project's venv when it exists, else python3 (e.g. in a container).
if [ -z "${PYTHON:-}" ]; then
    if [ -z "${CONTAINER_IMAGE:-}" ] && [ -x "$POSAUG_ROOT/.venv/bin/python" ]; then
        PYTHON=$POSAUG_ROOT/.venv/bin/python
    else
        PYTHON=python3
    fi
fi

# Allocation. Inside a job SLURM says what we got (sbatch command-line options override #SBATCH);
# in a dry run outside a job the launcher's #SBATCH defaults stand in for it.
if [ "$IN_JOB" = 1 ]; then
    NNODES=${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-1}}
    GPUS_PER_NODE=${GPUS_PER_NODE:-${SLURM_GPUS_ON_NODE:-${SLURM_GPUS_PER_NODE:-0}}}
    GPUS_PER_NODE=${GPUS_PER_NODE##*:}  # --gpus-per-node=a100:8 -> 8
    TASKS_PER_NODE=${TASKS_PER_NODE:-${SLURM_NTASKS_PER_NODE:-}}
    MASTER_ADDR=${RDZV_ADDR:-$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)}
    JOB_ID=$SLURM_JOB_ID
else
    NNODES=${NNODES:-$(_sbatch_default nodes)}
    NNODES=${NNODES:-1}
    GPUS_PER_NODE=${GPUS_PER_NODE:-$(_sbatch_default gpus-per-node)}
    GPUS_PER_NODE=${GPUS_PER_NODE:-0}
    GPUS_PER_NODE=${GPUS_PER_NODE##*:}
    TASKS_PER_NODE=${TASKS_PER_NODE:-$(_sbatch_default ntasks-per-node)}
    MASTER_ADDR=${RDZV_ADDR:-<first host of SLURM_JOB_NODELIST>}
    JOB_ID=0
fi
# One task per GPU; without GPUs (CPU/CI mode) one task per requested task, at least one.
if [ -z "$TASKS_PER_NODE" ]; then
    TASKS_PER_NODE=$GPUS_PER_NODE
    [ "$TASKS_PER_NODE" -gt 0 ] 2>/dev/null || TASKS_PER_NODE=1
fi
WORLD_SIZE=$(( NNODES * TASKS_PER_NODE ))
# Inherited MASTER_ADDR/MASTER_PORT are ignored on purpose: sbatch exports the submitting shell, which may
# hold a stale torchrun endpoint. Override with RDZV_ADDR / RDZV_PORT.
# 20000-39999: above the usual service ports, below Linux's ephemeral range (32768+ overlaps a little,
# but a collision needs the same node and the same job id modulo 20000 at the same time).
MASTER_PORT=${RDZV_PORT:-$(( 20000 + JOB_ID % 20000 ))}
CPUS_PER_TASK=${SLURM_CPUS_PER_TASK:-${CPUS_PER_TASK:-$(_sbatch_default cpus-per-task)}}
CPUS_PER_TASK=${CPUS_PER_TASK:-1}

if [ "$GPUS_PER_NODE" -gt 0 ] 2>/dev/null; then
    DEVICE=gpu
    BACKEND=nccl
else
    DEVICE=cpu
    BACKEND=gloo
fi

# Parallel layout: TP/PP from the environment, else the config. DP is what is left of the world; a DP
# given in the environment is checked against it (it cannot be set independently).
TP=${TP:-$(_config_value tensor_model_parallel_size)}
TP=${TP:-1}
PP=${PP:-$(_config_value pipeline_model_parallel_size)}
PP=${PP:-1}
if (( WORLD_SIZE % (TP * PP) )); then
    _die "world size $WORLD_SIZE ($NNODES nodes x $TASKS_PER_NODE tasks) is not divisible by TP*PP = $TP*$PP"
fi
_DP=$(( WORLD_SIZE / (TP * PP) ))
if [ -n "${DP:-}" ] && [ "$DP" != "$_DP" ]; then
    _die "DP=$DP but $WORLD_SIZE ranks / (TP=$TP x PP=$PP) = $_DP: change the node/GPU count, TP or PP"
fi
DP=$_DP

# ---- the trainer command ----------------------------------------------------------------------------
SETS=(
    "name=$RUN_NAME"
    "seed=$SEED"
    "checkpoint.save=$RUN_DIR"
    "parallel.tensor_model_parallel_size=$TP"
    "parallel.pipeline_model_parallel_size=$PP"
)
# The shipped configs target GPUs (Transformer Engine, BF16, distributed optimizer). On CPU-only nodes (CI's
# local clusters) Transformer Engine cannot run, so the local layers replace it; FP32 and the plain optimizer are
# kept there because the cluster tests compare loss curves across layouts bit for bit, which BF16 holds only within
# a tolerance (tests/trainer/test_parallel_equivalence.py). BF16 and the distributed optimizer do run on CPU
# (tests/trainer/test_shipped_configs.py): OVERRIDES or launcher arguments come later and win, e.g. --set model.bf16=true.
if [ "$DEVICE" = cpu ]; then
    SETS+=("model.transformer_impl=local" "model.bf16=false" "parallel.use_distributed_optimizer=false")
fi
if [ -n "${DATA_PREFIX:-}" ]; then
    SETS+=("data.data_path=$DATA_PREFIX")
fi
if [ "${SYNTHETIC_DATA:-0}" = 1 ]; then
    SETS+=("data.synthetic=true")
fi
# BUDGET: table1 (the shipped configs' tokens, the default) or chinchilla (20 tokens per parameter);
# pretrain/plan/budget.py turns the name into schedule.train_tokens.
if [ -n "${BUDGET:-}" ]; then
    _budget_tokens=$(cd "$POSAUG_ROOT" && "$PYTHON" -c 'import sys
from pretrain.plan.budget import budget_tokens
try:
    print(budget_tokens(sys.argv[1], sys.argv[2]))
except ValueError as error:
    sys.exit(f"BUDGET={sys.argv[2]}: {error}")' "$MODEL_SIZE" "$BUDGET") || _die "BUDGET=$BUDGET: see the line above (table1 or chinchilla)"
    SETS+=("schedule.train_tokens=$_budget_tokens")
fi
# OVERRIDES: whitespace-separated key=value list (values without spaces); launcher arguments come last.
read -r -a _OVERRIDES <<<"${OVERRIDES:-}"
SETS+=("${_OVERRIDES[@]}" "${EXTRA_SETS[@]}")

TRAIN_CMD=("$PYTHON" -m pretrain train --config "$CONFIG" --set "${SETS[@]}")

SRUN_CMD=(srun
    --nodes="$NNODES"
    --ntasks-per-node="$TASKS_PER_NODE"
    --ntasks="$WORLD_SIZE"
    # 22.05 srun no longer inherits --cpus-per-task from sbatch; without it every task gets one CPU.
    --cpus-per-task="$CPUS_PER_TASK"
    # A crashed rank must not leave the others blocked in a collective until the NCCL timeout.
    --kill-on-bad-exit=1
    # "0: ..." prefixes: which rank printed what.
    --label
    # torch.distributed rendezvous is env://, no MPI wiring needed (and none to break).
    --mpi=none
    --chdir="$POSAUG_ROOT"
)
if [ -n "${CONTAINER_IMAGE:-}" ]; then
    # pyxis/enroot: the project checkout, the run directory and the data must be visible inside.
    _mounts="$POSAUG_ROOT,$OUTPUT_DIR"
    [ -n "${DATA_PREFIX:-}" ] && _mounts="$_mounts,$(dirname "$DATA_PREFIX")"
    [ -n "${CONTAINER_MOUNTS:-}" ] && _mounts="$_mounts,$CONTAINER_MOUNTS"
    SRUN_CMD+=(--container-image="$CONTAINER_IMAGE" --container-mounts="$_mounts"
               --container-workdir="$POSAUG_ROOT")
fi
read -r -a _SRUN_EXTRA <<<"${SRUN_EXTRA_ARGS:-}"
SRUN_CMD+=("${_SRUN_EXTRA[@]}" "$POSAUG_ROOT/slurm/rank_env.sh")

REQUEUE=${REQUEUE:-1}
REQUEUE_EXIT_CODE=${REQUEUE_EXIT_CODE:-75}  # pretrain/trainer/config.py REQUEUE_EXIT_CODE
# After a hang (pretrain/trainer/watchdog.py writes <run dir>/hang/report.txt and exits 76) the job is requeued
# as after a preemption, at most MAX_HANG_REQUEUES times in a row without a new checkpoint in between.
MAX_HANG_REQUEUES=${MAX_HANG_REQUEUES:-3}
HANG_EXIT_CODE=76  # pretrain/trainer/watchdog.py HANG_EXIT_CODE

# ---- print what will run ----------------------------------------------------------------------------
cat <<SETTINGS
[posaug-slurm] ==== ${MODEL_SIZE} ${METHOD} ($( [ "$DRY_RUN" = 1 ] && echo "dry run" || echo "job $JOB_ID${SLURM_ARRAY_TASK_ID:+ array task $SLURM_ARRAY_TASK_ID}${SLURM_RESTART_COUNT:+ restart $SLURM_RESTART_COUNT}")) ====
  model size      ${MODEL_SIZE}
  method          ${METHOD}
  config          ${CONFIG}
  seed            ${SEED}
  run dir         ${RUN_DIR}
  data            ${DATA_PREFIX:-$( [ "${SYNTHETIC_DATA:-0}" = 1 ] && echo synthetic || echo "(config: data.data_path)")}
  project root    ${POSAUG_ROOT}
  python          ${PYTHON}
  container       ${CONTAINER_IMAGE:-(none)}
  nodes           ${NNODES} (${SLURM_JOB_NODELIST:-not allocated})
  device          ${DEVICE} (${GPUS_PER_NODE} GPUs/node, backend ${BACKEND})
  tasks/node      ${TASKS_PER_NODE} (world size ${WORLD_SIZE}, ${CPUS_PER_TASK} CPUs/task)
  TP / PP / DP    ${TP} / ${PP} / ${DP}
  rendezvous      env:// ${MASTER_ADDR}:${MASTER_PORT}
  requeue         $( [ "$REQUEUE" = 1 ] && echo "on exit code ${REQUEUE_EXIT_CODE}, and after a hang (at most ${MAX_HANG_REQUEUES} in a row)" || echo off)
  budget          ${BUDGET:-table1 = schedule.train_tokens of the config}
  overrides       ${SETS[*]}
SETTINGS
printf '[posaug-slurm] command:'
printf ' %q' "${SRUN_CMD[@]}" "${TRAIN_CMD[@]}"
printf '\n'

# _skip_or_die WHAT WHY: a check that could not run (or crashed) stops the launcher (exit 2) unless SKIP_PREFLIGHT=1
# (slurm/README.md): a check that cannot run must not pass for one that passed. A check that ran and refused is
# never skipped.
_skip_or_die() {
    if [ "${SKIP_PREFLIGHT:-0}" = 1 ]; then
        _log "WARNING: $1 could not run ($2); continuing without it because SKIP_PREFLIGHT=1"
    else
        _die "$1 could not run ($2); fix that (e.g. PYTHON=<a python with torch and this project>) or set SKIP_PREFLIGHT=1 to go on without it"
    fi
}

# ---- plan and pre-flight, in one Python process (pretrain/preflight.py: one torch import, not two) --------
# plan: memory per GPU and wall clock before anything starts (pretrain/plan, slurm/README.md). Refuses (exit 2)
# when the predicted peak exceeds the GPU's memory; --no-plan-check / PLAN_CHECK=0 starts anyway. PLAN_GPU names
# the GPU model (python -m pretrain plan --help lists them). A plan or pre-flight that cannot run at all (no Python
# with torch on this host, e.g. a container-only setup) or crashes stops the launcher too, unless SKIP_PREFLIGHT=1.
# pre-flight: `train --check` loads the config as the trainer will, checks the layout for WORLD_SIZE ranks, the
# data prefix (manifest and shards present, enough tokens) and that the data's tokenizer fits model.vocab_size.
# The same check refuses the submit path, shows in the dry run, and ends a plain-sbatch job in its first
# seconds, before the model is built.
PLAN_CHECK=${PLAN_CHECK:-1}
PLAN_GPU=${PLAN_GPU:-h100-80gb}
PLAN_ARGS=()
if [ "$DEVICE" = gpu ]; then
    if [ "$IN_JOB" = 1 ]; then
        _TIME_LIMIT=$(scontrol show job "$JOB_ID" 2>/dev/null | sed -n 's/.*TimeLimit=\([^ ]*\).*/\1/p' | head -n1)
    fi
    _TIME_LIMIT=${_TIME_LIMIT:-$(_sbatch_default time)}
    _LEAD=$(_sbatch_default signal)
    _LEAD=${_LEAD##*@}
    PLAN_ARGS=(--plan "$CONFIG" --gpu "$PLAN_GPU" --nodes "$NNODES" --gpus-per-node "$TASKS_PER_NODE" --check
               --set "${SETS[@]}")
    case "$_TIME_LIMIT" in
        ''|UNLIMITED|Partition_Limit|NONE) ;;
        *) PLAN_ARGS+=(--slurm-time "$_TIME_LIMIT" --usr1-lead "${_LEAD:-0}") ;;
    esac
fi
_PREFLIGHT_SETS=("${SETS[@]}")
if [ "$IN_JOB" = 0 ] && [ "$DEVICE" = gpu ]; then
    # a login node has no GPU: the distributed optimizer's device check is the job's (it runs this again)
    _PREFLIGHT_SETS+=("parallel.use_distributed_optimizer=false")
fi
_CHECKS=$(mktemp -d "${TMPDIR:-/tmp}/posaug-preflight.XXXXXX")
set +e
(cd "$POSAUG_ROOT" && WORLD_SIZE=$WORLD_SIZE "$PYTHON" -m pretrain.preflight "$_CHECKS" "${PLAN_ARGS[@]}" \
    --train --config "$CONFIG" --set "${_PREFLIGHT_SETS[@]}")
_checks_rc=$?
set -e
_plan_rc=$(cat "$_CHECKS/plan.rc" 2>/dev/null || echo "$_checks_rc")
_preflight_rc=$(cat "$_CHECKS/preflight.rc" 2>/dev/null || echo "$_checks_rc")
_preflight=$(cat "$_CHECKS/preflight.out" 2>/dev/null || true)
_plan_crash=$(grep -v '^\s*$' "$_CHECKS/plan.crash" 2>/dev/null | tail -n1 || true)
rm -rf "$_CHECKS"

if [ "$DEVICE" = gpu ]; then
    if [ "$_plan_rc" = 2 ]; then
        if [ "$PLAN_CHECK" = 1 ]; then
            _die "the plan refuses this run (reason above): change the setting it names (e.g. OVERRIDES=schedule.micro_batch_size=1, TP/PP, more nodes, PLAN_GPU=<your GPU>), or pass --no-plan-check to start anyway"
        fi
        _log "WARNING: the plan says this run does not fit; starting anyway (--no-plan-check)"
    elif [ "$_plan_rc" != 0 ]; then
        _skip_or_die "the plan" "$PYTHON -m pretrain plan exited $_plan_rc${_plan_crash:+: $_plan_crash}"
    fi
else
    _log "plan: skipped (CPU run, no GPU memory to check)"
fi

_reason=$(printf '%s\n' "$_preflight" | { grep -v '^\s*$' || true; } | tail -n1)
if [ "$_preflight_rc" = 2 ]; then
    # exit 2 is the check's refusal (config, data, tokenizer, layout). A dry run (settings, plan and command
    # printed above) refuses as the submission would: one line, exit 2.
    _die "refused before $( [ "$DRY_RUN" = 1 ] && echo "submitting (dry run, nothing queued)" \
        || { [ "$SUBMIT" = 1 ] && echo "submitting (nothing queued)" || echo "building the model"; }): ${_reason}"
elif [ "$_preflight_rc" != 0 ]; then
    # the check could not run here or crashed (e.g. a login node whose python has no torch): fail closed, since a
    # submit would queue a job that may die at start; SKIP_PREFLIGHT=1 says to go on (the trainer validates the
    # same config when it starts)
    _skip_or_die "the pre-flight check" "$PYTHON -m pretrain train --check exited $_preflight_rc: ${_reason:-no output}"
else
    _log "pre-flight: ${_preflight##*$'\n'}"
fi

if [ "$DRY_RUN" = 1 ]; then
    exit 0
fi
if [ "$SUBMIT" = 1 ]; then
    command -v sbatch >/dev/null || _die "sbatch not found: run this on a SLURM login node (or add --dry-run)"
    # --time: the plan's predicted wall clock x TIME_MARGIN + TIME_PAD_MIN (start-up, evaluation, the saves),
    # at most the launcher's #SBATCH --time (a longer run continues in requeued jobs); SBATCH_TIMELIMIT wins.
    _TIME_ARGS=()
    if [ -z "${SBATCH_TIMELIMIT:-}" ] && [ "$DEVICE" = gpu ]; then
        _wall=$(cd "$POSAUG_ROOT" && "$PYTHON" -m pretrain plan "$CONFIG" --gpu "$PLAN_GPU" --nodes "$NNODES" \
                --gpus-per-node "$TASKS_PER_NODE" --json --set "${SETS[@]}" 2>/dev/null \
                | "$PYTHON" -c 'import json, sys; print(int(json.load(sys.stdin)["wall_seconds"]))' 2>/dev/null || true)
        if [ -n "$_wall" ]; then
            _minutes=$(( (_wall * ${TIME_MARGIN_PERCENT:-120} / 100 + 59) / 60 + ${TIME_PAD_MIN:-20} ))
            _cap=$(_sbatch_default time)
            _cap_minutes=$(cd "$POSAUG_ROOT" && "$PYTHON" -c "import sys; from pretrain.plan.report import parse_slurm_time as p; print(int(p(sys.argv[1]) // 60))" "$_cap" 2>/dev/null || echo "$_minutes")
            (( _minutes > _cap_minutes )) && _minutes=$_cap_minutes
            _TIME_ARGS=("--time=$_minutes")
            _log "--time=$_minutes min: the plan's ${_wall} s x ${TIME_MARGIN_PERCENT:-120}% + ${TIME_PAD_MIN:-20} min, at most the launcher's $_cap (SBATCH_TIMELIMIT=... to choose)"
        fi
    fi
    # The layout checked above is the one submitted: NNODES, TASKS_PER_NODE, GPUS_PER_NODE and CPUS_PER_TASK
    # from the environment become sbatch options where they differ from this launcher's #SBATCH lines.
    _LAYOUT_ARGS=()
    for _option in "nodes=$NNODES" "ntasks-per-node=$TASKS_PER_NODE" "gpus-per-node=$GPUS_PER_NODE" \
                   "cpus-per-task=$CPUS_PER_TASK"; do
        _line=$(_sbatch_default "${_option%%=*}")
        [ "${_line##*:}" = "${_option#*=}" ] || _LAYOUT_ARGS+=("--$_option")
    done
    _SUBMIT=(sbatch "${_TIME_ARGS[@]}" "${_LAYOUT_ARGS[@]}" "$LAUNCHER_FILE" "${LAUNCHER_ARGS[@]}")
    _log "checks passed: submitting ${_SUBMIT[*]}"
    exec "${_SUBMIT[@]}"
fi

# ---- run ---------------------------------------------------------------------------------------------
export MASTER_ADDR MASTER_PORT
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$CPUS_PER_TASK}
if [ "$DEVICE" = gpu ]; then
    # Fail fast instead of hanging on a broken peer; async error handling lets the trainer's collective
    # time out and the job end (and be requeued) rather than burn its allocation.
    export TORCH_NCCL_ASYNC_ERROR_HANDLING=${TORCH_NCCL_ASYNC_ERROR_HANDLING:-1}
    export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-1}  # Megatron TP/SP overlap
fi
mkdir -p "$RUN_DIR"
# Ranks that exit with the requeue code touch this file (slurm/rank_env.sh); it lives in the run
# directory because that is on storage every node shares (checkpoints need it anyway).
export REQUEUE_EXIT_CODE
export POSAUG_REQUEUE_MARKER=$RUN_DIR/.requeue-request-$SLURM_JOB_ID
rm -f "$POSAUG_REQUEUE_MARKER"

# Bash runs traps only between commands, so srun runs in the background and we `wait` for it: a
# signal interrupts `wait`, the trap forwards it to srun (which forwards it to every task), and we go
# back to waiting for the trainer to save and exit.
_SRUN_PID=
_forward() {
    _log "received SIG$1: forwarding to the training step"
    [ -n "$_SRUN_PID" ] && kill -s "$1" "$_SRUN_PID" 2>/dev/null || true
}
trap '_forward USR1' USR1
trap '_forward TERM' TERM

_STARTED=$(date +%s)
_HANG_REPORT=$RUN_DIR/hang/report.txt
_hang_reported() { [ -f "$_HANG_REPORT" ] && [ "$(stat -c %Y "$_HANG_REPORT" 2>/dev/null || echo 0)" -ge "$_STARTED" ]; }
# srun waits for every task's exit message; after a partition the tasks on a node cut off from this (batch)
# node never get theirs through. HANG_SRUN_GRACE s after the hang report the job's steps are cancelled through
# slurmctld (which still reaches every node), and srun is ended if it still waits.
HANG_SRUN_GRACE=${HANG_SRUN_GRACE:-10}
_job_steps() { squeue -h -s -j "$SLURM_JOB_ID" -o %i 2>/dev/null | grep -E '^[0-9]+\.[0-9]+$' || true; }
_watch_hang() {
    while kill -0 "$_SRUN_PID" 2>/dev/null; do
        if _hang_reported; then
            sleep "$HANG_SRUN_GRACE"
            if kill -0 "$_SRUN_PID" 2>/dev/null; then
                _log "srun still waits ${HANG_SRUN_GRACE} s after the hang report (for a node it cannot reach): cancelling the step"
                for _step in $(_job_steps); do scancel "$_step" 2>/dev/null || true; done
                sleep 5
                kill -KILL "$_SRUN_PID" 2>/dev/null || true
            fi
            return 0
        fi
        sleep 2
    done
}
set +e
"${SRUN_CMD[@]}" "${TRAIN_CMD[@]}" &
_SRUN_PID=$!
_watch_hang &
_WATCH_PID=$!
while :; do
    wait "$_SRUN_PID"; rc=$?
    [ "$rc" -gt 128 ] || break
    # >128: srun died of a signal, or a trapped signal interrupted `wait` while srun runs on.
    if ! kill -0 "$_SRUN_PID" 2>/dev/null; then wait "$_SRUN_PID"; rc=$?; break; fi
done
kill "$_WATCH_PID" 2>/dev/null
set -e
_log "training step exited with code $rc"
if [ -e "$POSAUG_REQUEUE_MARKER" ]; then
    rm -f "$POSAUG_REQUEUE_MARKER"
    _log "the trainer saved a checkpoint on a stop signal (exit code $REQUEUE_EXIT_CODE)"
    [ "$rc" = 0 ] && rc=$REQUEUE_EXIT_CODE
fi

# A hang report written by this attempt: name the node(s), and requeue unless hangs keep coming without progress.
if _hang_reported; then
    _log "the trainer reported a hang: $(head -n1 "$_HANG_REPORT")"
    _hung_hosts=$(sed -n 's/^hosts: *//p' "$_HANG_REPORT")
    if [ -n "$_hung_hosts" ]; then
        _log "hung node(s): $_hung_hosts (to keep them out: sbatch --exclude=${_hung_hosts// /,} ...)"
    fi
    _latest=$(cat "$RUN_DIR/latest_checkpointed_iteration.txt" 2>/dev/null || echo none)
    _hangs=0 _hang_at=
    [ -f "$RUN_DIR/.hang-requeues" ] && read -r _hangs _hang_at < "$RUN_DIR/.hang-requeues"
    if [ "${_hang_at:-}" = "$_latest" ]; then _hangs=$(( ${_hangs:-0} + 1 )); else _hangs=1; fi
    echo "$_hangs $_latest" > "$RUN_DIR/.hang-requeues"
    if [ "$REQUEUE" = 1 ] && [ "$_hangs" -le "$MAX_HANG_REQUEUES" ]; then
        _log "hang $_hangs of at most $MAX_HANG_REQUEUES in a row at checkpoint $_latest: requeueing job $SLURM_JOB_ID (it will resume from $RUN_DIR)"
        # a step still ending on a node (its slurmstepd kills late) must be gone before the requeued job starts there
        for _ in $(seq 60); do [ -z "$(_job_steps)" ] && break; sleep 1; done
        if scontrol requeue "$SLURM_JOB_ID"; then
            exit 0
        fi
        _log "scontrol requeue failed (job not requeueable here?); resubmit to resume"
    elif [ "$REQUEUE" = 1 ]; then
        _log "not requeueing: $_hangs hangs in a row with no checkpoint after $_latest (MAX_HANG_REQUEUES=$MAX_HANG_REQUEUES); look at the stacks in $RUN_DIR/hang, exclude the node(s) named above and resubmit"
    fi
    exit "$HANG_EXIT_CODE"
fi

# `scancel JOB` (a person ending the job) also reaches the trainer as SIGTERM; it must not be undone by a requeue
# (scontrol requeue takes a cancelled job back). slurmctld shows such a job COMPLETING with no reason, while a
# time limit says Reason=TimeLimit and `scancel --signal` leaves it RUNNING.
_cancelled() {
    local show
    show=$(scontrol show job -o "$SLURM_JOB_ID" 2>/dev/null) || return 1
    case "$show" in *JobState=RUNNING*) return 1 ;; esac
    case "$show" in *JobState=CANCELLED*|*"Reason=None"*) return 0 ;; esac
    return 1
}
if [ "$rc" = "$REQUEUE_EXIT_CODE" ] && [ "$REQUEUE" = 1 ] && _cancelled; then
    _log "job $SLURM_JOB_ID was cancelled (scancel): not requeueing; the checkpoint in $RUN_DIR is kept, submit again to resume"
elif [ "$rc" = "$REQUEUE_EXIT_CODE" ] && [ "$REQUEUE" = 1 ]; then
    # The trainer saved a checkpoint because it was told to stop (time limit, preemption). Put this
    # same job back in the queue; it resumes from the checkpoint when it starts again.
    _log "requeueing job $SLURM_JOB_ID (it will resume from $RUN_DIR)"
    if scontrol requeue "$SLURM_JOB_ID"; then
        exit 0
    fi
    _log "scontrol requeue failed (job not requeueable here?); resubmit to resume"
fi
exit "$rc"
