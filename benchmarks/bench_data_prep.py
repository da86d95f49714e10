"""Benchmark: data_prep vs Megatron-LM's tools/preprocess_data.py on the same JSONL, tokenizer and workers.

Reports wall time, tokens/s, MB/s and peak RSS (summed over the process tree, sampled) for
both tools in one run, and the throughput ratio. Megatron-LM's source is never vendored:
pass --megatron-lm PATH (or set MEGATRON_LM_PATH) to a checkout (e.g. tag core_v0.16.1);
without it the script says so and reports data_prep alone.

    python benchmarks/bench_data_prep.py --workers 2 [--megatron-lm ~/Megatron-LM] [--megatron-python PY]
        [--input corpus.jsonl] [--compare-backends]

Besides wall time it reports CPU seconds (user+sys of the whole process tree, from the
children's rusage): on a machine shared with other jobs, wall time mostly measures the load,
while CPU time per MB is what the tool costs. Runs are interleaved in one invocation.

data_prep encodes GPT-2 BPE with tiktoken when it is installed (identical ids; see
data_prep/tokenizers.py), else with `tokenizers`; --compare-backends also runs the latter
(DATA_PREP_TOKENIZER_BACKEND=tokenizers).

Megatron-LM's environment, as set up for the measurement in the report (tag core_v0.16.1,
commit 55ac7082517c3878ae653c07c09c534b8aed49f6), in a venv separate from the project's:

    git --git-dir=<bare clone> --work-tree=/tmp/Megatron-LM checkout -f core_v0.16.1 -- .
    python3 -m venv /tmp/mlm-venv
    /tmp/mlm-venv/bin/pip install torch==2.13.0 numpy regex psutil pyyaml pydantic six einops packaging
    python benchmarks/bench_data_prep.py --megatron-lm /tmp/Megatron-LM --megatron-python /tmp/mlm-venv/bin/python

triton is NOT installed: preprocess_data.py reaches megatron/training/initialize.py, which
imports megatron.core.transformer.custom_layers.batch_invariant_kernels, which imports
triton at module level (no kernel runs while preprocessing). Stubbing the `triton` package
itself breaks torch._dynamo, so when triton is missing this script runs preprocess_data.py
through a small wrapper (MEGATRON_WRAPPER below) that pre-registers a stub of that one
Megatron module and then runs the script unchanged with runpy.

Without --input it writes a ~38 MB JSONL (like the anchor's 37.9 MB) from the embedded
stdlib corpus; without --tokenizer it trains a GPT-2-sized (50,257) byte-level BPE and saves
it as vocab.json + merges.txt, which both tools read (GPT2BPETokenizer on Megatron's side).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def peak_rss_run(cmd: list[str], env: dict, cwd: str, timeout: float) -> tuple[float, int, int, str, int, float]:
    """Run cmd; returns (wall s, peak summed RSS of the tree, return code, output tail, peak summed PSS, CPU s).

    CPU s is user+sys of cmd and every descendant it waited for (pool workers are joined).

    RSS summed over forked workers counts pages shared with the parent (e.g. an imported torch)
    once per process; PSS splits shared pages between processes, so it is the fairer total.
    """
    import psutil

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak = peak_pss = 0
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        root = psutil.Process(proc.pid)
        while proc.poll() is None:
            try:
                procs = [root] + root.children(recursive=True)
                peak = max(peak, sum(p.memory_info().rss for p in procs if p.is_running()))
                peak_pss = max(peak_pss, sum(p.memory_full_info().pss for p in procs if p.is_running()))
            except psutil.Error:
                pass
            if time.time() - t0 > timeout:
                proc.kill()
            time.sleep(0.1)
    finally:
        proc.wait()
    reader.join(5)
    wall = time.time() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, peak, proc.returncode, "".join(out)[-3000:], peak_pss, cpu


MEGATRON_WRAPPER = """
import importlib.util, runpy, sys, types
if importlib.util.find_spec("triton") is None:
    name = "megatron.core.transformer.custom_layers.batch_invariant_kernels"
    stub = types.ModuleType(name)
    def _needs_triton(*a, **k):
        raise RuntimeError("batch-invariant kernels need triton")
    def _getattr(attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _needs_triton
    stub.__getattr__ = _getattr
    sys.modules[name] = stub
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def make_jsonl(path: str, target_bytes: int) -> tuple[int, int]:
    """~target_bytes of JSONL built from the embedded corpus (documents ~12 KB, like the anchor's)."""
    from data_prep.corpus import iter_stdlib_documents

    texts = [t for _, t in iter_stdlib_documents()]
    blob = "\n\n".join(texts)
    n = size = 0
    pos = 0
    with open(path, "w") as fh:
        while size < target_bytes:
            chunk = blob[pos: pos + 12000]
            pos = (pos + 12000) % max(1, len(blob) - 12000)
            line = json.dumps({"text": chunk}) + "\n"
            fh.write(line)
            size += len(line.encode())
            n += 1
    return n, size


def make_tokenizer(out_dir: str, corpus: str, vocab_size: int) -> str:
    """Train a byte-level BPE and save it GPT-2 style (vocab.json + merges.txt)."""
    from tokenizers import Tokenizer

    from data_prep.train_tokenizer import train_tokenizer

    path = train_tokenizer([corpus], os.path.join(out_dir, "hf"), "bytelevel-bpe", vocab_size,
                           sample_bytes=8_000_000)
    gpt2_dir = os.path.join(out_dir, "gpt2")
    os.makedirs(gpt2_dir, exist_ok=True)
    Tokenizer.from_file(path).model.save(gpt2_dir)
    return gpt2_dir


def count_tokens(prefix: str) -> int:
    """Tokens in a .bin/.idx pair."""
    from data_prep.writer import megatron_indexed

    ds = megatron_indexed().IndexedDataset(prefix, mmap=True)
    return int(ds.sequence_lengths.sum())


def report_identical_ids(ours_prefix: str, megatron_prefix: str) -> None:
    """Print whether data_prep (--normalize none, the JSONL default) wrote byte-identical shards to Megatron-LM's.

    With one shard and no validation split data_prep keeps corpus order, so equal .bin files mean
    equal token ids document by document, and equal .idx files mean equal document boundaries.
    """
    from data_prep.checksums import sha256_file

    same = {ext: sha256_file(f"{ours_prefix}.{ext}") == sha256_file(f"{megatron_prefix}.{ext}") for ext in ("bin", "idx")}
    print(f"token ids identical to Megatron-LM's preprocess_data.py: .bin {'yes' if same['bin'] else 'NO'}, "
          f".idx {'yes' if same['idx'] else 'NO'}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--megatron-lm", default=os.environ.get("MEGATRON_LM_PATH"),
                    help="path to a Megatron-LM checkout (or env MEGATRON_LM_PATH)")
    ap.add_argument("--megatron-python", default=os.environ.get("MEGATRON_LM_PYTHON", sys.executable),
                    help="interpreter whose environment can run Megatron-LM's preprocess_data.py "
                         "(or env MEGATRON_LM_PYTHON; default: this one)")
    ap.add_argument("--compare-backends", action="store_true",
                    help="also run data_prep with DATA_PREP_TOKENIZER_BACKEND=tokenizers")
    ap.add_argument("--input", help="JSONL with a 'text' key (default: generate one)")
    ap.add_argument("--target-mb", type=float, default=38.0, help="size of the generated JSONL")
    ap.add_argument("--tokenizer", help="directory with vocab.json + merges.txt (default: train one)")
    ap.add_argument("--vocab-size", type=int, default=50257)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--workdir", default=None, help="where inputs/outputs go (default: a temp dir)")
    ap.add_argument("--rss-scaling", action="store_true", help="also run data_prep on a quarter of the input")
    ap.add_argument("--scale", type=int, default=1,
                    help="also run both tools on the input repeated K times and print the steady-state ratio")
    ap.add_argument("--timeout", type=float, default=3600)
    args = ap.parse_args()

    work = args.workdir or tempfile.mkdtemp(prefix="bench_data_prep_")
    os.makedirs(work, exist_ok=True)
    env = dict(os.environ, PYTHONWARNINGS="ignore", TOKENIZERS_PARALLELISM="false")
    print(f"workdir: {work}")

    corpus = args.input
    if corpus is None:
        corpus = os.path.join(work, "corpus.jsonl")
        if not os.path.exists(corpus):
            n, size = make_jsonl(corpus, int(args.target_mb * 1e6))
            print(f"generated {corpus}: {n} documents, {size / 1e6:.1f} MB")
    in_mb = os.path.getsize(corpus) / 1e6
    tok_dir = args.tokenizer or os.path.join(work, "tok", "gpt2")
    if not os.path.exists(os.path.join(tok_dir, "merges.txt")):
        t0 = time.time()
        tok_dir = make_tokenizer(os.path.join(work, "tok"), corpus, args.vocab_size)
        print(f"trained byte-level BPE ({args.vocab_size}) in {time.time() - t0:.1f}s -> {tok_dir}")

    results = {}

    def ours(name: str, path: str, backend: str = "auto") -> None:
        prefix = os.path.join(work, name, "out")
        cmd = [sys.executable, "-m", "data_prep", "build", "--input", path, "--tokenizer", tok_dir,
               "--data-prefix", prefix, "--workers", str(args.workers), "--valid-docs", "0", "--no-progress",
               "--force"]
        wall, rss, rc, tail, pss, cpu = peak_rss_run(
            cmd, dict(env, PYTHONPATH=REPO, DATA_PREP_TOKENIZER_BACKEND=backend), REPO, args.timeout)
        if rc != 0:
            print(f"data_prep failed (rc={rc}):\n{tail}")
            sys.exit(1)
        with open(prefix + "_manifest.json") as fh:
            man = json.load(fh)
        results[name] = dict(wall=wall, rss=rss, pss=pss, cpu=cpu, tokens=man["tokens"]["total"],
                             mb=os.path.getsize(path) / 1e6)
        print(f"{name}: backend {man['tokenizer'].get('backend')}, {wall:.1f}s wall, {cpu:.1f}s CPU", flush=True)

    ours("data_prep", corpus)
    if args.compare_backends:
        ours("data_prep_tokenizers", corpus, "tokenizers")
    if args.rss_scaling:
        quarter = os.path.join(work, "quarter.jsonl")
        with open(corpus) as src, open(quarter, "w") as dst:
            lines = src.readlines()
            dst.writelines(lines[: len(lines) // 4])
        ours("data_prep_quarter", quarter)

    mlm = args.megatron_lm
    script = os.path.join(mlm, "tools", "preprocess_data.py") if mlm else None

    def megatron(name: str, path: str) -> bool:
        prefix = os.path.join(work, name, "out")
        os.makedirs(os.path.dirname(prefix), exist_ok=True)
        cmd = [args.megatron_python, "-c", MEGATRON_WRAPPER, script, "--input", path, "--output-prefix", prefix,
               "--json-keys", "text", "--legacy-tokenizer", "--tokenizer-type", "GPT2BPETokenizer",
               "--vocab-file", os.path.join(tok_dir, "vocab.json"), "--merge-file", os.path.join(tok_dir, "merges.txt"),
               "--workers", str(args.workers), "--append-eod"]
        wall, rss, rc, tail, pss, cpu = peak_rss_run(cmd, dict(env, PYTHONPATH=mlm), mlm, args.timeout)
        if rc != 0:
            print(f"\nMegatron-LM preprocess_data.py failed (rc={rc}); reporting data_prep only:\n{tail}")
            return False
        results[name] = dict(wall=wall, rss=rss, pss=pss, cpu=cpu, tokens=count_tokens(prefix + "_text_document"),
                             mb=os.path.getsize(path) / 1e6)
        print(f"{name}: {wall:.1f}s wall, {cpu:.1f}s CPU", flush=True)
        return True

    if not script or not os.path.exists(script):
        print("\nMegatron-LM source not available (pass --megatron-lm PATH or set MEGATRON_LM_PATH to a checkout, "
              "e.g. `git clone --branch core_v0.16.1 https://github.com/NVIDIA/Megatron-LM`); "
              "reporting data_prep only. Anchor measured elsewhere: 290K tokens/s, 0.95 MB/s, 450 MB peak RSS "
              "(37.9 MB JSONL, 2 workers).")
    elif megatron("megatron_lm", corpus):
        report_identical_ids(os.path.join(work, "data_prep", "out_00000_text_document"),
                             os.path.join(work, "megatron_lm", "out_text_document"))
        ours("data_prep_again", corpus)  # interleaved: data_prep before and after Megatron-LM
        if args.scale > 1:
            # Start-up (imports, pools) is paid once per build; on a corpus K times larger it is amortised,
            # so the difference between the two sizes gives each tool's steady-state rate.
            big = os.path.join(work, f"corpus_x{args.scale}.jsonl")
            if not os.path.exists(big):
                with open(corpus) as src:
                    lines = src.readlines()
                with open(big, "w") as dst:
                    for _ in range(args.scale):
                        dst.writelines(lines)
            ours(f"data_prep_x{args.scale}", big)
            megatron(f"megatron_lm_x{args.scale}", big)

    print(f"\ninput {corpus}: {in_mb:.1f} MB, workers {args.workers}")
    print(f"{'tool':<22}{'wall s':>8}{'CPU s':>8}{'tokens':>12}{'tokens/s':>11}{'MB/s':>7}"
          f"{'tok/CPU-s':>11}{'MB/CPU-s':>9}{'peak RSS MB':>12}{'peak PSS MB':>12}")
    for name, r in results.items():
        print(f"{name:<22}{r['wall']:>8.1f}{r['cpu']:>8.1f}{r['tokens']:>12,}{r['tokens'] / r['wall']:>11,.0f}"
              f"{r['mb'] / r['wall']:>7.2f}{r['tokens'] / r['cpu']:>11,.0f}{r['mb'] / r['cpu']:>9.2f}"
              f"{r['rss'] / 1e6:>12.0f}{r['pss'] / 1e6:>12.0f}")
    if "megatron_lm" in results:
        b = results["megatron_lm"]
        for name in ("data_prep", "data_prep_again"):
            a = results[name]
            ratio = (a["tokens"] / a["wall"]) / (b["tokens"] / b["wall"])
            print(f"{name} / Megatron-LM: wall throughput {ratio:.2f}x (goal >= 5x), CPU cost "
                  f"{b['cpu'] / a['cpu']:.2f}x less; peak RSS ratio {a['rss'] / b['rss']:.2f}")
        if a["tokens"] != b["tokens"]:
            print(f"note: token counts differ ({a['tokens']} vs {b['tokens']})")
        big_a, big_b = results.get(f"data_prep_x{args.scale}"), results.get(f"megatron_lm_x{args.scale}")
        if big_a and big_b:
            # the faster of data_prep's two 1x runs: subtracting less time gives the lower (conservative) rate
            small_a = min((results["data_prep"], results["data_prep_again"]), key=lambda r: r["wall"])
            rate_a = (big_a["tokens"] - small_a["tokens"]) / max(1e-9, big_a["wall"] - small_a["wall"])
            rate_b = (big_b["tokens"] - b["tokens"]) / max(1e-9, big_b["wall"] - b["wall"])
            print(f"steady state ({args.scale}x input minus 1x): data_prep {rate_a:,.0f} tokens/s, Megatron-LM "
                  f"{rate_b:,.0f} tokens/s: {rate_a / rate_b:.2f}x (goal >= 5x); at {args.scale}x end to end: "
                  f"{(big_a['tokens'] / big_a['wall']) / (big_b['tokens'] / big_b['wall']):.2f}x")
    else:
        r = results["data_prep"]
        print(f"throughput vs the anchor's 290K tokens/s (a different machine): "
              f"{r['tokens'] / r['wall'] / 290e3:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
