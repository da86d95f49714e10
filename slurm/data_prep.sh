#!/usr/bin/env bash
#SBATCH --job-name=posaug-data-prep
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --cpus-per-task=8
#SBATCH --time=12:00:00
#SBATCH --output=%x-%j.out
# Tokenize a corpus into Megatron shards with MPI-parallel data_prep: one MPI rank per task, each rank
# takes its share of the input files and runs WORKERS tokenizer processes; rank 0 writes the manifest.
# The output is byte-identical to a single-process `python -m data_prep build` with the same arguments.
#
#   INPUT=/data/owt TOKENIZER=/data/tok DATA_PREFIX=/data/shards/owt sbatch slurm/data_prep.sh
#   INPUT="/data/a /data/b.jsonl.gz" ... sbatch --nodes=4 slurm/data_prep.sh
#   INPUT=... TOKENIZER=... DATA_PREFIX=... bash slurm/data_prep.sh --dry-run   # print, run nothing
#
# Environment:
#   INPUT           file(s)/directory(ies), whitespace-separated (required)
#   TOKENIZER       tokenizer.json, a vocab.json+merges.txt dir, or a SentencePiece .model (required)
#   DATA_PREFIX     OUT/name -> OUT/name_00000_text_document.{bin,idx} + OUT/name_manifest.json (required);
#                   the training launchers' DATA_PREFIX, data_prep's --data-prefix
#   NUM_SHARDS      train shards (default: data_prep's)
#   WORKERS         tokenizer processes per rank (default: CPUs per task)
#   DATA_PREP_ARGS  extra `data_prep build` arguments, e.g. "--valid-docs 100 --seed 3"
#   POSAUG_ROOT, PYTHON, CONTAINER_IMAGE, CONTAINER_MOUNTS, DRY_RUN   as for the training launchers
#
# MPI wiring: `srun --mpi=pmix` starts the ranks and OpenMPI (mpi4py) connects through SLURM's PMIx
# server, so no mpirun and no hostfile. (pmi2 does not work with Debian's OpenMPI 4.1; on the local
# cluster PMIx needs libpmix-dev's unversioned libpmix.so, which slurm/local/start.sh installs.)
set -euo pipefail

DRY_RUN=${DRY_RUN:-0}
for arg in "$@"; do
    case "$arg" in
        --dry-run|--test-only) DRY_RUN=1 ;;
        *) echo "unknown argument '$arg' (expected --dry-run); settings come from the environment" >&2; exit 2 ;;
    esac
done

# sbatch runs a copy of this file from slurmd's spool directory, so inside a job $0 does not lead back
# to the project: use POSAUG_ROOT, else this file's directory (bash, dry runs), else the path sbatch was
# given (scontrol's Command=; the first line, as an array's last task shows every task), else the
# submit directory.
if [ -z "${POSAUG_ROOT:-}" ]; then
    for _dir in "$(dirname "${BASH_SOURCE[0]}")/.." \
                "$(dirname "$(scontrol show job "${SLURM_JOB_ID:-none}" 2>/dev/null | sed -n 's/^ *Command=\([^ ]*\).*/\1/p' | head -n1)")/.." \
                "${SLURM_SUBMIT_DIR:-.}"; do
        if [ -f "$_dir/slurm/common.sh" ]; then POSAUG_ROOT=$(cd "$_dir" && pwd); break; fi
    done
fi
[ -f "${POSAUG_ROOT:-}/slurm/common.sh" ] || { echo "set POSAUG_ROOT to the project checkout" >&2; exit 2; }

# a missing setting is refused as every launcher refuses: one line, exit 2 (bash's own ${VAR:?} exits 1)
_need() { [ -n "${!1:-}" ] || { echo "set $1 to $2" >&2; exit 2; }; }
_need INPUT "the corpus file(s)/directory(ies)"
_need TOKENIZER "a trained tokenizer (python -m data_prep train-tokenizer ...)"
# the old name of DATA_PREFIX: refused, since a launcher that ignored it would fail later and less clearly
if [ -n "${OUTPUT_PREFIX:-}" ] && [ -z "${DATA_PREFIX:-}" ]; then
    echo "OUTPUT_PREFIX is now DATA_PREFIX (the training launchers' name): DATA_PREFIX=$OUTPUT_PREFIX" >&2
    exit 2
fi
_need DATA_PREFIX "OUT/name"
if [ -z "${PYTHON:-}" ]; then
    if [ -z "${CONTAINER_IMAGE:-}" ] && [ -x "$POSAUG_ROOT/.venv/bin/python" ]; then
        PYTHON=$POSAUG_ROOT/.venv/bin/python
    else
        PYTHON=python3
    fi
fi

if [ -n "${SLURM_JOB_ID:-}" ]; then
    NNODES=${SLURM_JOB_NUM_NODES:-1}
    NTASKS=${SLURM_NTASKS:-1}
    CPUS_PER_TASK=${SLURM_CPUS_PER_TASK:-1}
elif [ "$DRY_RUN" = 1 ]; then
    _default() { sed -n "s/^#SBATCH --$1=\([^ ]*\).*/\1/p" "${BASH_SOURCE[0]}" | head -n1; }
    NNODES=$(_default nodes)
    NTASKS=$(( NNODES * $(_default ntasks-per-node) ))
    CPUS_PER_TASK=$(_default cpus-per-task)
else
    echo "not inside a SLURM job: submit with 'sbatch slurm/data_prep.sh' (or add --dry-run)" >&2
    exit 2
fi
WORKERS=${WORKERS:-$CPUS_PER_TASK}

CMD=("$PYTHON" -m data_prep build --tokenizer "$TOKENIZER" --data-prefix "$DATA_PREFIX"
     --workers "$WORKERS" --mpi --no-progress)
read -r -a _inputs <<<"$INPUT"
for i in "${_inputs[@]}"; do CMD+=(--input "$i"); done
[ -n "${NUM_SHARDS:-}" ] && CMD+=(--num-shards "$NUM_SHARDS")
read -r -a _extra <<<"${DATA_PREP_ARGS:-}"
CMD+=("${_extra[@]}")

SRUN=(srun --nodes="$NNODES" --ntasks="$NTASKS" --cpus-per-task="$CPUS_PER_TASK" --mpi=pmix
      --kill-on-bad-exit=1 --chdir="$POSAUG_ROOT")
if [ -n "${CONTAINER_IMAGE:-}" ]; then
    _mounts="$POSAUG_ROOT,$(dirname "$DATA_PREFIX")"
    for i in "${_inputs[@]}"; do _mounts="$_mounts,$(dirname "$i")"; done
    [ -n "${CONTAINER_MOUNTS:-}" ] && _mounts="$_mounts,$CONTAINER_MOUNTS"
    SRUN+=(--container-image="$CONTAINER_IMAGE" --container-mounts="$_mounts" --container-workdir="$POSAUG_ROOT")
fi

cat <<SETTINGS
[posaug-slurm] ==== data_prep build ($( [ "$DRY_RUN" = 1 ] && echo "dry run" || echo "job $SLURM_JOB_ID")) ====
  input           ${INPUT}
  tokenizer       ${TOKENIZER}
  data prefix     ${DATA_PREFIX}
  shards          ${NUM_SHARDS:-(data_prep default)}
  MPI ranks       ${NTASKS} on ${NNODES} node(s) (${SLURM_JOB_NODELIST:-not allocated}), ${WORKERS} workers each
  project root    ${POSAUG_ROOT}
  python          ${PYTHON}
  container       ${CONTAINER_IMAGE:-(none)}
SETTINGS
printf '[posaug-slurm] command:'
printf ' %q' "${SRUN[@]}" "${CMD[@]}"
printf '\n'
[ "$DRY_RUN" = 1 ] && exit 0

mkdir -p "$(dirname "$DATA_PREFIX")"
# Each rank runs WORKERS processes of its own; keep BLAS/tokenizer thread pools from oversubscribing.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export TOKENIZERS_PARALLELISM=${TOKENIZERS_PARALLELISM:-false}
# A rank that crashes in native code (a segfault in MPI, torch or a tokenizer) prints its Python stack; without
# this, OpenMPI's handler prints only "Process received signal" and the address, which names no code.
export PYTHONFAULTHANDLER=${PYTHONFAULTHANDLER:-1}
exec "${SRUN[@]}" "${CMD[@]}"
