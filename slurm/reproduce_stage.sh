#!/usr/bin/env bash
#SBATCH --job-name=posaug-grid
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=8
#SBATCH --time=04:00:00
#SBATCH --output=%x-%j.out
# One step of `python -m pretrain reproduce --slurm` that is not training (training goes through the
# pretrain_<size>_<method>.sh launchers). `reproduce --slurm` submits it; by hand:
#
#   sbatch slurm/reproduce_stage.sh data   OUT         # CPU presets: corpus -> tokenizer -> shards
#   sbatch slurm/reproduce_stage.sh eval   OUT RUN     # one run's evaluation record(s) (RUN = <size>_<method>_seed<seed>)
#   sbatch slurm/reproduce_stage.sh report OUT         # OUT/report.md from whatever finished
#
# OUT is the grid directory (its grid.json says the preset, sizes, methods, seeds and data). Environment:
# POSAUG_ROOT and PYTHON as for the launchers (slurm/README.md). One process, no srun: the evaluation of
# one model uses one GPU (or the CPUs on a CPU node).
set -euo pipefail

if [ $# -lt 2 ] || { [ "$1" = eval ] && [ $# -lt 3 ]; }; then
    echo "usage: sbatch $0 {data|eval|report} OUT [RUN]" >&2
    exit 2
fi

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
if [ -z "${PYTHON:-}" ]; then
    if [ -x "$POSAUG_ROOT/.venv/bin/python" ]; then PYTHON=$POSAUG_ROOT/.venv/bin/python; else PYTHON=python3; fi
fi

STAGE=$1
OUT=$2
ARGS=(-m pretrain reproduce --slurm-stage "$STAGE" --output "$OUT")
[ "$STAGE" = eval ] && ARGS+=(--run "$3")
echo "[posaug-grid] ==== ${STAGE}${3:+ $3} (job ${SLURM_JOB_ID:-none} on $(hostname)) ===="
echo "[posaug-grid] command: $PYTHON ${ARGS[*]}"
cd "$POSAUG_ROOT"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-${SLURM_CPUS_PER_TASK:-1}}
exec "$PYTHON" "${ARGS[@]}"
