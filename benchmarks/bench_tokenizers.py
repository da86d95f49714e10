"""Benchmark: data_prep vs Megatron-LM's preprocess_data.py per tokenizer (GPT-2 BPE and tokenizer.json files).

For each tokenizer the same JSONL is built by data_prep and by Megatron-LM's
tools/preprocess_data.py (GPT2BPETokenizer on vocab.json + merges.txt; HuggingFaceTokenizer, i.e.
transformers' AutoTokenizer, on a tokenizer.json), interleaved (data_prep, Megatron-LM,
data_prep again), then both on the file repeated --scale times. Printed: wall s, CPU s, MB per
CPU-second, peak PSS, the ratio to Megatron-LM (end to end, and at steady state = the K-times
run minus the 1-time run, which cancels start-up), and a document-by-document comparison of the
token ids. How Megatron-LM is obtained and run is bench_data_prep.py's (its docstring).

    python benchmarks/bench_tokenizers.py --megatron-lm /tmp/Megatron-LM [--megatron-python PY]
        [--workers 2] [--target-mb 38] [--scale 4] [--tokenizers gpt2,neox,deepseek3]
        [--tokenizer-json NAME=PATH ...] [--compare-backends] [--workdir DIR]

The tokenizer.json files are trained here on the first 8 MB of the corpus, laid out like the real
ones (tests/data_prep/tokenizer_styles.py; benchmarks/README.md says what each reproduces): neox is
GPT-NeoX-20B's layout (also Pythia's; 50,254 model tokens without the 13 byte tokens UTF-8 never
needs, plus 23 added whitespace runs = 50,277), deepseek3 DeepSeek-V3's (three Split steps +
ByteLevel, 1,283 added tokens; 50,000 model tokens instead of 128,000 to keep training short).
--tokenizer-json NAME=PATH runs a tokenizer.json you have (e.g. the real GPT-NeoX-20B file) the
same way. --compare-backends also runs data_prep with DATA_PREP_TOKENIZER_BACKEND=tokenizers
(HF `tokenizers`, the path a tokenizer.json takes when the fast encoder does not reproduce it).
"""

from __future__ import annotations

import argparse
import json
import hashlib
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "data_prep"))  # tokenizer_styles: test-only, not in the package

from bench_data_prep import MEGATRON_WRAPPER, make_jsonl, make_tokenizer, peak_rss_run  # noqa: E402


STYLED = {"neox": 50254, "deepseek3": 50000}  # tokenizer.json styles trained here -> model vocab size


def make_styled(out_dir: str, corpus: str, style: str) -> str:
    """Train a `style` tokenizer.json on the first 8 MB of the corpus; returns its directory."""
    from tokenizer_styles import train_styled_tokenizer

    texts, size = [], 0
    with open(corpus, encoding="utf-8") as fh:
        for line in fh:
            texts.append(json.loads(line)["text"])
            size += len(line)
            if size > 8_000_000:
                break
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as fh:
        fh.write(train_styled_tokenizer(style, texts, STYLED[style]))
    write_tokenizer_config(out_dir)
    return out_dir


def write_tokenizer_config(out_dir: str) -> None:
    """tokenizer_config.json naming the EOS that data_prep appends as EOD (Megatron-LM appends the EOS).

    transformers' AutoTokenizer (Megatron-LM's HuggingFaceTokenizer) reads the directory.
    """
    from data_prep.tokenizers import load_tokenizer

    tok = load_tokenizer(os.path.join(out_dir, "tokenizer.json"))
    eos = tok.decode([tok.eod])
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as fh:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos, "bos_token": eos,
                   "unk_token": eos, "pad_token": tok.decode([tok.pad])}, fh, ensure_ascii=False)


def sha256_file(path: str) -> str:
    """Hex sha256 of a file (which tokenizer file a recorded number was measured with)."""
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def compare_documents(ours: str, theirs: str) -> str:
    """'N/N documents identical' or where the first difference is (both files keep corpus order)."""
    from data_prep.writer import megatron_indexed

    Indexed = megatron_indexed().IndexedDataset
    a, b = Indexed(ours, mmap=True), Indexed(theirs, mmap=True)
    differing = [i for i in range(min(len(a), len(b))) if len(a[i]) != len(b[i]) or not (a[i] == b[i]).all()]
    same, first = min(len(a), len(b)) - len(differing), (differing[0] if differing else None)
    text = f"{same}/{max(len(a), len(b))} documents identical"
    if len(a) != len(b):
        text += f" (document counts differ: {len(a)} vs {len(b)})"
    return text if first is None else text + f"; first difference in document {first}"


def repeat_file(path: str, times: int) -> str:
    """The JSONL repeated `times` times (written once)."""
    big = f"{path[:-len('.jsonl')]}_x{times}.jsonl"
    if not os.path.exists(big):
        with open(path) as src:
            data = src.read()
        with open(big, "w") as dst:
            for _ in range(times):
                dst.write(data)
    return big


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--megatron-lm", default=os.environ.get("MEGATRON_LM_PATH"), required=False,
                    help="path to a Megatron-LM checkout (or env MEGATRON_LM_PATH)")
    ap.add_argument("--megatron-python", default=os.environ.get("MEGATRON_LM_PYTHON", sys.executable))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--target-mb", type=float, default=38.0, help="size of the generated JSONL")
    ap.add_argument("--input", help="JSONL with a 'text' key (default: generate one from the embedded corpus)")
    ap.add_argument("--scale", type=int, default=4, help="also run on the input repeated K times (steady state)")
    ap.add_argument("--tokenizers", default="gpt2,neox,deepseek3", help="which of gpt2,neox,deepseek3 to run")
    ap.add_argument("--tokenizer-json", action="append", default=[], metavar="NAME=PATH",
                    help="also run this tokenizer.json (e.g. the real GPT-NeoX-20B file) under NAME")
    ap.add_argument("--compare-backends", action="store_true", help="also run data_prep on HF tokenizers")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--timeout", type=float, default=3600)
    args = ap.parse_args()

    script = os.path.join(args.megatron_lm or "", "tools", "preprocess_data.py")
    if not args.megatron_lm or not os.path.exists(script):
        print("Megatron-LM source not available: pass --megatron-lm PATH (a checkout, e.g. tag core_v0.16.1; "
              "see bench_data_prep.py for its environment)")
        return 2
    work = args.workdir or tempfile.mkdtemp(prefix="bench_tokenizers_")
    os.makedirs(work, exist_ok=True)
    env = dict(os.environ, PYTHONWARNINGS="ignore", TOKENIZERS_PARALLELISM="false")
    corpus = args.input or os.path.join(work, "corpus.jsonl")
    if not os.path.exists(corpus):
        n, size = make_jsonl(corpus, int(args.target_mb * 1e6))
        print(f"generated {corpus}: {n} documents, {size / 1e6:.1f} MB", flush=True)
    tok_dirs = {}
    for name in filter(None, args.tokenizers.split(",")):
        t0 = time.time()
        if name == "gpt2":
            tok_dirs[name] = os.path.join(work, "tok", "gpt2")
            if not os.path.exists(os.path.join(tok_dirs[name], "merges.txt")):
                tok_dirs[name] = make_tokenizer(os.path.join(work, "tok"), corpus, 50257)
        elif name in STYLED:
            tok_dirs[name] = os.path.join(work, "tok", name)
            if not os.path.exists(os.path.join(tok_dirs[name], "tokenizer.json")):
                make_styled(tok_dirs[name], corpus, name)
        else:
            ap.error(f"--tokenizers: unknown {name!r} (want gpt2, {', '.join(STYLED)})")
        print(f"tokenizer {name}: {tok_dirs[name]} ({time.time() - t0:.0f}s)", flush=True)

    for item in args.tokenizer_json:
        name, _, path = item.partition("=")
        if not path or not os.path.isfile(path):
            ap.error(f"--tokenizer-json {item!r}: want NAME=PATH of a tokenizer.json")
        tok_dirs[name] = os.path.join(work, "tok", name)
        os.makedirs(tok_dirs[name], exist_ok=True)
        shutil.copyfile(path, os.path.join(tok_dirs[name], "tokenizer.json"))
        write_tokenizer_config(tok_dirs[name])
        print(f"tokenizer {name}: {path} (sha256 {sha256_file(path)})", flush=True)

    results: dict[str, dict] = {}

    def record(key: str, path: str, wall: float, pss: int, cpu: float, tail: str, rc: int) -> None:
        if rc != 0:
            print(f"{key} failed (rc={rc}):\n{tail}")
            sys.exit(1)
        mb = os.path.getsize(path) / 1e6
        results[key] = dict(wall=wall, cpu=cpu, pss=pss, mb=mb)
        print(f"{key}: {wall:.1f}s wall, {cpu:.1f}s CPU, {mb / cpu:.2f} MB/CPU-s, peak PSS {pss / 1e6:.0f} MB",
              flush=True)

    def ours(key: str, tok: str, path: str, backend: str = "auto") -> str:
        prefix = os.path.join(work, key, "out")
        cmd = [sys.executable, "-m", "data_prep", "build", "--input", path, "--tokenizer", tok, "--data-prefix",
               prefix, "--workers", str(args.workers), "--valid-docs", "0", "--no-progress", "--force"]
        wall, _, rc, tail, pss, cpu = peak_rss_run(
            cmd, dict(env, PYTHONPATH=REPO, DATA_PREP_TOKENIZER_BACKEND=backend), REPO, args.timeout)
        record(key, path, wall, pss, cpu, tail, rc)
        with open(prefix + "_manifest.json") as fh:
            tok_record = json.load(fh)["tokenizer"]
        results[key]["encoder"] = tok_record["backend"]
        if tok_record.get("fallback_reason"):
            print(f"  {key}: encoder {tok_record['backend']} ({tok_record['fallback_reason']})")
        return prefix + "_00000_text_document"

    def megatron(key: str, name: str, path: str) -> str:
        prefix = os.path.join(work, key, "out")
        os.makedirs(os.path.dirname(prefix), exist_ok=True)
        tok = tok_dirs[name]
        if name == "gpt2":
            tok_args = ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", os.path.join(tok, "vocab.json"),
                        "--merge-file", os.path.join(tok, "merges.txt")]
        else:
            tok_args = ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", tok]
        cmd = [args.megatron_python, "-c", MEGATRON_WRAPPER, script, "--input", path, "--output-prefix", prefix,
               "--json-keys", "text", "--legacy-tokenizer", *tok_args, "--workers", str(args.workers),
               "--append-eod"]
        wall, _, rc, tail, pss, cpu = peak_rss_run(cmd, dict(env, PYTHONPATH=args.megatron_lm), args.megatron_lm,
                                                   args.timeout)
        record(key, path, wall, pss, cpu, tail, rc)
        return prefix + "_text_document"

    comparisons = {}
    big = repeat_file(corpus, args.scale) if args.scale > 1 else None
    for name, tok in tok_dirs.items():
        tok_arg = tok if name == "gpt2" else os.path.join(tok, "tokenizer.json")
        a = ours(f"{name}/data_prep", tok_arg, corpus)
        b = megatron(f"{name}/megatron_lm", name, corpus)
        comparisons[name] = compare_documents(a, b)
        print(f"{name}: token ids vs Megatron-LM: {comparisons[name]}", flush=True)
        ours(f"{name}/data_prep_again", tok_arg, corpus)
        if args.compare_backends:
            ours(f"{name}/data_prep_tokenizers", tok_arg, corpus, backend="tokenizers")
        if big:
            ours(f"{name}/data_prep_x{args.scale}", tok_arg, big)
            megatron(f"{name}/megatron_lm_x{args.scale}", name, big)

    print(f"\ninput {corpus}: {os.path.getsize(corpus) / 1e6:.1f} MB, workers {args.workers}, scale {args.scale}")
    print(f"{'run':<30}{'encoder':>12}{'MB':>8}{'wall s':>8}{'CPU s':>8}{'MB/CPU-s':>10}{'MB/s':>7}{'peak PSS MB':>13}")
    for key, r in results.items():
        print(f"{key:<30}{r.get('encoder', 'megatron'):>12}{r['mb']:>8.1f}{r['wall']:>8.1f}{r['cpu']:>8.1f}"
              f"{r['mb'] / r['cpu']:>10.2f}{r['mb'] / r['wall']:>7.2f}{r['pss'] / 1e6:>13.0f}")
    for name in tok_dirs:
        m = results[f"{name}/megatron_lm"]
        for run in ("data_prep", "data_prep_again"):
            r = results[f"{name}/{run}"]
            print(f"{name} {run} / Megatron-LM at 1x: {m['cpu'] / r['cpu']:.2f}x MB per CPU-second, "
                  f"{m['wall'] / r['wall']:.2f}x wall")
        if big:
            small = min((results[f"{name}/data_prep"], results[f"{name}/data_prep_again"]), key=lambda r: r["cpu"])
            r, mb = results[f"{name}/data_prep_x{args.scale}"], results[f"{name}/megatron_lm_x{args.scale}"]
            ours_rate = (r["mb"] - small["mb"]) / max(1e-9, r["cpu"] - small["cpu"])
            their_rate = (mb["mb"] - m["mb"]) / max(1e-9, mb["cpu"] - m["cpu"])
            ours_dt, their_dt = r["wall"] - small["wall"], mb["wall"] - m["wall"]
            # on a loaded machine a 1x run can take longer than the Kx one: then wall says nothing
            wall = f"{their_dt / ours_dt:.2f}x" if ours_dt > 0 and their_dt > 0 else "n/a (load changed)"
            print(f"{name} steady state ({args.scale}x minus 1x): data_prep {ours_rate:.2f} MB/CPU-s, Megatron-LM "
                  f"{their_rate:.2f} MB/CPU-s: {ours_rate / their_rate:.2f}x (goal >= 5x with a NeoX tokenizer.json); wall {wall}; "
                  f"peak PSS {r['pss'] / 1e6:.0f} MB at {args.scale}x vs {small['pss'] / 1e6:.0f} MB at 1x")
        print(f"{name}: token ids vs Megatron-LM (1x): {comparisons[name]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
