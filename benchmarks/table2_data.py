"""The Table 2 row's data (issue 59), packed here to travel with the checkout and tokenized on the GPU machine.

pack (here): a folder of .txt documents -> zstd-compressed JSONL parts (the corpus), a byte-level BPE tokenizer
trained on it (data_prep train-tokenizer), and the shards data_prep builds from them here, whose sha256s and token
counts go into pack.json. The pack (corpus + tokenizer + pack.json) must fit one device call (PACK_LIMIT).
unpack (there, 16 cores): data_prep build of the same parts with the same arguments; every shard file's sha256
must equal the one recorded here, or one line and exit 2. The validation split is data_prep's held-out documents:
the trainer reads the training shards only, the evaluation the validation stream.

  python benchmarks/table2_data.py pack --input DOCS_DIR --output .gpu_data_table2 [--vocab-size 50257]
  python3 benchmarks/table2_data.py unpack --pack .gpu_data_table2 --output .table2_shards --workers 16
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PACK_LIMIT = 55 * 2**20  # one device call carries 64 MiB with the checkout (~14 MiB)
PARTS = 16  # compressed JSONL files: data_prep reads each compressed file as one unit, one worker each
SEED = 1234
VALID_FRACTION = 0.02


class PackError(Exception):
    """A pack that is missing, too large, or whose shards differ: one line for the user."""


def shard_digests(prefix: Path) -> dict[str, str]:
    """sha256 of every .bin/.idx file data_prep wrote under the prefix's folder."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(prefix.parent.iterdir()) if p.suffix in (".bin", ".idx")}


def build_args(pack: Path, prefix: Path, workers: int, settings: dict) -> list[str]:
    """data_prep build's arguments, the same here and there."""
    return ["build", "--input", str(pack / "corpus"), "--tokenizer", str(pack / "tokenizer"), "--data-prefix",
            str(prefix), "--valid-fraction", str(settings["valid_fraction"]), "--seed", str(settings["seed"]),
            "--format", "jsonl", "--workers", str(workers), "--no-progress"]


def write_parts(documents: list[Path], corpus: Path, parts: int) -> int:
    """Every document as one JSONL record, round-robin over `parts` zstd files; the bytes of text written."""
    import zstandard

    corpus.mkdir(parents=True, exist_ok=True)
    # one compressor per file: a compressor's context serves one stream at a time; level 19 took ~10x longer
    writers = [zstandard.ZstdCompressor(level=12, threads=-1).stream_writer(
        open(corpus / f"part-{i:02d}.jsonl.zst", "wb")) for i in range(min(parts, len(documents)))]
    written = 0
    for index, path in enumerate(documents):
        text = path.read_text(encoding="utf-8", errors="replace")
        writers[index % len(writers)].write((json.dumps({"text": text}) + "\n").encode())
        written += len(text.encode())
    for writer in writers:
        writer.close()
    return written


def pack(inputs: Path, output: Path, vocab_size: int, work: Path, valid_fraction: float = VALID_FRACTION,
         corpus_name: str = "") -> dict:
    """Build the pack from a folder of .txt documents; pack.json's contents."""
    from data_prep.cli import main as data_prep
    from data_prep.manifest import load_manifest

    documents = sorted(inputs.rglob("*.txt"))
    if not documents:
        raise PackError(f"{inputs} holds no .txt documents: pass the folder of the corpus's text files")
    if output.exists():
        shutil.rmtree(output)
    text_bytes = write_parts(documents, output / "corpus", PARTS)
    if data_prep(["train-tokenizer", "--input", str(output / "corpus"), "--output", str(output / "tokenizer"),
                  "--kind", "bytelevel-bpe", "--vocab-size", str(vocab_size), "--format", "jsonl"]):
        raise PackError("data_prep train-tokenizer failed (its message is above)")
    settings = {"valid_fraction": valid_fraction, "seed": SEED}
    prefix = work / "shards" / "corpus"
    if prefix.parent.exists():
        shutil.rmtree(prefix.parent)
    if data_prep(build_args(output, prefix, 2, settings) + ["--force"]):
        raise PackError("data_prep build failed (its message is above)")
    manifest = load_manifest(str(prefix))
    size = sum(p.stat().st_size for p in output.rglob("*") if p.is_file())
    info = {"corpus": corpus_name or inputs.name, "documents": len(documents), "text_bytes": text_bytes,
            "vocab_size": vocab_size, **settings, "train_tokens": manifest.num_tokens,
            "valid_tokens": manifest.num_valid_tokens, "pack_bytes": size, "shards": shard_digests(prefix)}
    (output / "pack.json").write_text(json.dumps(info, indent=1) + "\n")
    if size > PACK_LIMIT:
        raise PackError(f"the pack is {size / 2**20:.1f} MiB, over the {PACK_LIMIT // 2**20} MiB one device call "
                        "carries beside the checkout: pass fewer documents")
    return info


def unpack(pack_dir: Path, output: Path, workers: int) -> Path:
    """Tokenize the pack's corpus into output/shards and check every shard file; the data prefix."""
    from data_prep.cli import main as data_prep

    info_path = pack_dir / "pack.json"
    if not info_path.is_file():
        raise PackError(f"{info_path} is missing: carry the pack (python benchmarks/table2_data.py pack ... here)")
    info = json.loads(info_path.read_text())
    prefix = output / "shards" / "corpus"
    done = output / "verified.json"
    if done.is_file() and json.loads(done.read_text()) == info["shards"]:
        return prefix
    if data_prep(build_args(pack_dir, prefix, workers, info)):
        raise PackError("data_prep build of the pack failed (its message is above)")
    found = shard_digests(prefix)
    if found != info["shards"]:
        differ = sorted(n for n in set(found) | set(info["shards"]) if found.get(n) != info["shards"].get(n))
        raise PackError(f"the shards built from {pack_dir} differ from those built where it was packed "
                        f"({', '.join(differ)}): pack it again")
    shutil.copy(pack_dir / "pack.json", output / "pack.json")
    done.write_text(json.dumps(found))
    return prefix


def main(argv: list[str] | None = None) -> int:
    """pack | unpack."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    p = sub.add_parser("pack")
    p.add_argument("--input", required=True, help="a folder of .txt documents")
    p.add_argument("--output", default=".gpu_data_table2")
    p.add_argument("--vocab-size", type=int, default=50257)
    p.add_argument("--valid-fraction", type=float, default=VALID_FRACTION)
    p.add_argument("--work", default=".table2_shards", help="where the shards built here go (ignored folder)")
    p.add_argument("--name", default="", help="the corpus's name in the report")
    u = sub.add_parser("unpack")
    u.add_argument("--pack", default=".gpu_data_table2")
    u.add_argument("--output", default=".table2_shards")
    u.add_argument("--workers", type=int, default=16)
    args = parser.parse_args(argv)
    try:
        if args.action == "pack":
            info = pack(Path(args.input), Path(args.output), args.vocab_size, Path(args.work), args.valid_fraction,
                        args.name)
            print(f"pack {args.output}: {info['documents']} documents, {info['train_tokens']:,} training and "
                  f"{info['valid_tokens']:,} validation tokens, {info['pack_bytes'] / 2**20:.1f} MiB")
        else:
            print(f"data prefix {unpack(Path(args.pack), Path(args.output), args.workers)}: shards as packed")
        return 0
    except PackError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
