"""`eval run`'s memory estimate (pretrain/evaluation/memory.py) against the peak anonymous-memory growth of a real eval on CPU.

    .venv/bin/python benchmarks/bench_eval_memory.py RUN_DIR DATA [--lengths 16384 49152 98304] [--backend hf]

Each length runs in its own subprocess: torch, Megatron-Core, transformers and the eval modules are imported
first, then `eval run RUN_DIR --data DATA --lengths L --num-spans 1` runs in process while a thread samples its
anonymous resident memory; the growth is peak minus before (model weights, activations, logits chunks, spans: what
the estimate covers; library pages are left out, tests/evaluation/eval_memory_helpers.py says why).
DATA may be a data_prep prefix or an indexed prefix (a train shard, for lengths longer than the validation split).
"""

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "evaluation"))

from eval_memory_helpers import measure  # noqa: E402


def main() -> None:
    from pretrain.evaluation.memory import model_shape, peak_bytes

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("data")
    parser.add_argument("--lengths", type=int, nargs="+", default=[16384, 49152, 98304])
    parser.add_argument("--backend", default="hf")
    args = parser.parse_args()
    shape = model_shape(args.run_dir)
    print(f"{shape}; one span; MiB")
    print(f"{'length':>8}{'estimated':>12}{'measured':>12}{'meas/est':>10}")
    for length in args.lengths:
        estimated = peak_bytes(shape, length, 1, 1, args.backend)  # one span: one per forward pass
        measured = measure(args.run_dir, args.data, length, args.backend)
        print(f"{length:>8}{estimated / 2**20:>12.1f}{measured / 2**20:>12.1f}{measured / estimated:>10.3f}",
              flush=True)


if __name__ == "__main__":
    main()
