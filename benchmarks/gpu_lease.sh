#!/bin/bash
# The one command of a GPU lease (the device machine: Python 3.12, CUDA torch, no megatron-core, no Transformer
# Engine, no network): `python -m pretrain selfcheck`, then benchmarks/gpu_lease.py (issue 40's GPU item) until
# BUDGET seconds after the start. Needs, carried beside the checkout:
#   .whl/       megatron-core 0.16.1 and zstandard wheels for cp312 (pip download --python-version 3.12 ...)
#   .gpu_data/  data/shards/corpus.* and data/tokenizer/ (built here: python benchmarks/gpu_lease.py --prepare-data
#               --output .gpu_data)
# Writes to $OUT: nvidia-smi.txt, selfcheck.txt, lease.log, report.md, results.json, the plots (*.png),
# lease_files.tgz (every run's config and log, every evaluation record).
set -u
start=$(date +%s)
budget=${1:-560}
shift
# further arguments go to gpu_lease.py (e.g. --tokens-per-s R --eval-reserve S, from an earlier lease; with
# --tokens-per-run N the same command, called again on the warm machine, continues the runs from .lease/)
out=${OUT:-/tmp/gpu_lease_out}
lease=$PWD/.lease  # ignored by git: the device machine keeps it between calls while it stays warm
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "wheels did not install" >"$out/lease.log"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi >"$out/nvidia-smi.txt" 2>&1
# selfcheck beside the lease's first call: it needs little of the GPU, and a calibration then errs low
[ -e "$lease/plan.json" ] || (timeout 200 python3 -m pretrain selfcheck >"$out/selfcheck.txt" 2>&1
 echo "selfcheck exit $? after $(($(date +%s) - start)) s" >>"$out/selfcheck.txt") &
timeout $((start + budget - $(date +%s))) python3 benchmarks/gpu_lease.py --output "$lease" \
  --data-prefix .gpu_data/data/shards/corpus --deadline $((start + budget - 15)) "$@" >"$out/lease.log" 2>&1
echo "gpu_lease exit $? after $(($(date +%s) - start)) s" >>"$out/lease.log"
wait
cp "$lease"/report.md "$lease"/results.json "$lease"/*.png "$out/" 2>/dev/null
tar czf "$out/lease_files.tgz" -C "$lease" plan.json logs configs eval 2>/dev/null
exit 0
