#!/bin/bash
# The device command of issue 60's benchmark (prepared, not yet run): benchmarks/bench_gpu_step.py for the 10m and
# the 113m preset on one GPU, inside BUDGET seconds (default 560) from the start. Each preset runs in its own
# process under its own time limit, so one that fails or runs out of time leaves the other's files. Needs .whl/
# carried beside the checkout (megatron-core 0.16.1 for cp312, as benchmarks/gpu_lease.sh). Writes to $OUT:
# nvidia-smi.txt, bench_10m.log, bench_113m.log, and bench_10m/, bench_113m/ (bench.json, table.txt,
# trace_*.json.gz); copy them to benchmarks/results/gpu_h200_bench_step/.
set -u
start=$(date +%s)
budget=${1:-560}
out=${OUT:-/tmp/gpu_bench_out}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "wheels did not install" >"$out/bench_10m.log"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi >"$out/nvidia-smi.txt" 2>&1
# 10m gets 40 % of what is left after the install, 113m (about 10x the FLOPs per token) the rest
left=$((start + budget - $(date +%s)))
timeout $((left * 2 / 5)) python3 benchmarks/bench_gpu_step.py --preset 10m --rounds 3 --steps-per-round 3 \
  --output "$out/bench_10m" >"$out/bench_10m.log" 2>&1
echo "bench 10m exit $? after $(($(date +%s) - start)) s" >>"$out/bench_10m.log"
timeout $((start + budget - 5 - $(date +%s))) python3 benchmarks/bench_gpu_step.py --preset 113m --rounds 2 \
  --steps-per-round 3 --output "$out/bench_113m" >"$out/bench_113m.log" 2>&1
echo "bench 113m exit $? after $(($(date +%s) - start)) s" >>"$out/bench_113m.log"
exit 0
