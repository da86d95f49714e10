#!/usr/bin/env bash
# Line coverage of pretrain/, megatron_ext/ and data_prep/ over the whole suite on the pinned megatron-core,
# subprocesses included: every Python process started from .venv (pytest workers, `python -m pretrain` CLIs, torchrun
# and its ranks, the SLURM jobs the local clusters run, forked test processes) records its own data file through a
# .pth hook (COVERAGE_PROCESS_START), and the files are combined at the end. A process killed by SIGKILL records
# nothing, so the table is a floor. Usage: make coverage (docs/testing.md keeps the table and the rule it serves:
# a change to the suite lowers no package by more than 0.5 points).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=${COVERAGE_OUT:-$root/.coverage-data}
rm -rf "$out" && mkdir -p "$out"
.venv/bin/pip install -q 'coverage>=7.6'
cat > "$out/coveragerc" <<EOF
[run]
parallel = True
data_file = $out/.coverage
source = pretrain, megatron_ext, data_prep
sigterm = True
concurrency = thread, multiprocessing
# forked children (the suite's zygote, Megatron's forked checkpoint writers) record files of their own
patch = fork, _exit
EOF
site=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "import coverage; coverage.process_startup()" > "$site/zz_posaug_coverage.pth"
trap 'rm -f "$site/zz_posaug_coverage.pth"' EXIT
status=0
COVERAGE_PROCESS_START=$out/coveragerc .venv/bin/python -m pytest -q -p no:cacheprovider \
    -n "${TEST_WORKERS:-3}" --dist loadfile --no-loadscope-reorder "$@" || status=$?
rm -f "$site/zz_posaug_coverage.pth"
.venv/bin/python -m coverage combine --rcfile="$out/coveragerc" -q
.venv/bin/python - "$out/coveragerc" <<'EOF'
import sys
from pathlib import Path

import coverage

cov = coverage.Coverage(config_file=sys.argv[1])
cov.load()
totals: dict[str, list[int]] = {}
for package in ("pretrain", "megatron_ext", "data_prep"):  # every file, the never-imported ones at 0 %
    for path in sorted(str(p.resolve()) for p in Path(package).rglob("*.py")):
        _, statements, _, missing, _ = cov.analysis2(path)
        total = totals.setdefault(package, [0, 0])
        total[0] += len(statements)
        total[1] += len(statements) - len(missing)
print("package        statements  covered  percent")
for package, (statements, covered) in sorted(totals.items()):
    print(f"{package:<14} {statements:>10} {covered:>8} {100 * covered / statements:>7.2f}")
EOF
echo "pytest exit status: $status"
