#!/bin/bash
# The paper's Table 2 row on the device machine (issue 59): benchmarks/gpu_table2.py, baseline and PosAug of the
# 10m preset side by side at the paper's 500M tokens each, or the largest equal budget that fits (the report's first
# line says which). Needs, carried beside the checkout (as benchmarks/gpu_lease.sh):
#   .whl/              megatron-core 0.16.1 and zstandard wheels (benchmarks/gpu_te/kit.py download puts them there)
#   .gpu_data_table2/  the data pack (python benchmarks/table2_data.py pack --input DOCS)
# Usage: bash benchmarks/gpu_table2.sh CALL_SECONDS [LEASE_SECONDS [gpu_table2.py arguments...]]
#   first call: e.g. `bash benchmarks/gpu_table2.sh 590 840` (it calibrates the rate); while it exits 3 ("run
#   again"), the same command again on the warm machine continues the runs (the plan keeps the first deadline).
# Writes $OUT/table2.log, report.md, results.json, plan.json. PYTHON overrides python3 (the CPU dry run).
set -u
start=$(date +%s)
call=${1:-590}
lease=${2:-$call}
shift $(($# < 2 ? $# : 2))
py=${PYTHON:-python3}
out=${OUT:-/tmp/gpu_table2_out}
mkdir -p "$out"
# find_spec, not an import: `import megatron.core` costs ~10 CPU-s of torch._dynamo (megatron_ext/import_shims.py)
if ! $py -c "import importlib.util as u, sys; sys.exit(u.find_spec('megatron.core') is None)" 2>/dev/null; then
  # the device machine has no megatron-core
  $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "error: the wheels in .whl/ did not install" | tee "$out/table2.log"; exit 1; }
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD PYTHONUNBUFFERED=1
timeout $((start + call - $(date +%s))) $py benchmarks/gpu_table2.py --deadline $((start + lease - 15)) \
  --call-deadline $((start + call - 15)) --export "$out" "$@" >"$out/table2.log" 2>&1
code=$?
echo "gpu_table2 exit $code after $(($(date +%s) - start)) s" >>"$out/table2.log"
tail -40 "$out/table2.log"
exit $code
