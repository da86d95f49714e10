"""Peak RSS growth of one real `eval run` on CPU, in a subprocess (tests/evaluation and benchmarks/bench_eval_memory.py).

torch, Megatron-Core, transformers and the eval modules are imported first and VmRSS is read; then `eval run`
runs in the same process, and the growth is ru_maxrss minus that VmRSS: what pretrain/evaluation/memory.py
estimates (weights, activations, logits chunks, spans), without the libraries themselves.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CHILD = """
import json, resource, sys, tempfile
import megatron_ext  # noqa: F401  (first, as under `python -m pretrain`: its import shims skip torch._dynamo)
import torch, megatron.core, transformers  # noqa: F401  (imports are not what the estimate covers)
from pretrain.evaluation import cli, scorers  # noqa: F401
from pretrain.trainer import inference_model  # noqa: F401
from pretrain.hf import export  # noqa: F401
def rss():
    for line in open('/proc/self/status'):
        if line.startswith('VmRSS:'):
            return int(line.split()[1]) * 1024
before = rss()
code = cli.eval_cli(sys.argv[1:] + ['--out', tempfile.mkdtemp(), '--no-progress'])
print('MEASURED ' + json.dumps({'code': code, 'growth': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before}))
"""


def measure(run_dir: str, data: str, length: int, backend: str = "hf") -> int:
    """Peak RSS growth in bytes of one `eval run` at `length` (one span)."""
    env = dict(os.environ, PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-c", CHILD, "run", run_dir, "--data", data, "--lengths", str(length),
                           "--num-spans", "1", "--backend", backend], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=900)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("MEASURED ")]
    if not lines or json.loads(lines[-1][9:])["code"] != 0:
        raise AssertionError(f"eval at {length} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][9:])["growth"]
