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
#
# This file resolves the settings and prints them with the command; then, sourced from here in turn:
# common_checks.sh (plan and pre-flight, the dry run's end, the submit path) and common_run.sh (srun, signal
# forwarding, the hang watch, requeue).

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

# shellcheck source=common_checks.sh
source "$POSAUG_ROOT/slurm/common_checks.sh"
# shellcheck source=common_run.sh
source "$POSAUG_ROOT/slurm/common_run.sh"
