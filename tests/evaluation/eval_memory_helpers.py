"""Peak anonymous-memory growth of one real `eval run` on CPU, in a subprocess (tests/evaluation and
benchmarks/bench_eval_memory.py).

torch, Megatron-Core, transformers and the eval modules are imported first; then `eval run` runs in the same process
while a thread samples its anonymous resident memory (statm's resident minus shared pages) every millisecond. The
growth, peak minus the value before, is what pretrain/evaluation/memory.py estimates (weights, activations, logits
chunks, spans). File-backed pages are left out on purpose: library code re-read after the kernel reclaimed it (the
host's DAMON reclaim pages out cold pages, docs/testing.md) counted in ru_maxrss and made a loaded `make test` read
2.1x the estimate (CI, 2026-12-03) where a quiet run reads 1.0x; with no swap, anonymous pages are never paged out.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CHILD = """
import json, os, sys, tempfile, threading, time
import megatron_ext  # noqa: F401  (first, as under `python -m pretrain`: its import shims skip torch._dynamo)
import torch, megatron.core, transformers  # noqa: F401  (imports are not what the estimate covers)
from pretrain.evaluation import cli, scorers  # noqa: F401
from pretrain.trainer import inference_model  # noqa: F401
from pretrain.hf import export  # noqa: F401
PAGE = os.sysconf('SC_PAGE_SIZE')
def anonymous():
    with open('/proc/self/statm') as statm:
        resident, shared = statm.read().split()[1:3]
    return (int(resident) - int(shared)) * PAGE
before, peak, done = anonymous(), [0], threading.Event()
def sample():
    while not done.is_set():
        peak[0] = max(peak[0], anonymous())
        time.sleep(0.001)
sampler = threading.Thread(target=sample, daemon=True)
sampler.start()
code = cli.eval_cli(sys.argv[1:] + ['--out', tempfile.mkdtemp(), '--no-progress'])
done.set()
sampler.join()
print('MEASURED ' + json.dumps({'code': code, 'growth': peak[0] - before}))
"""


def measure(run_dir: str, data: str, length: int, backend: str = "hf") -> int:
    """Peak anonymous-memory growth in bytes of one `eval run` at `length` (one span)."""
    env = dict(os.environ, PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-c", CHILD, "run", run_dir, "--data", data, "--lengths", str(length),
                           "--num-spans", "1", "--backend", backend], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=900)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("MEASURED ")]
    if not lines or json.loads(lines[-1][9:])["code"] != 0:
        raise AssertionError(f"eval at {length} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][9:])["growth"]
