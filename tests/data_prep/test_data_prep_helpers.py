"""Fixture builders shared by the data_prep tests (small corpora in every supported layout).

No tests here; the other test_data_prep_* modules import these functions.
"""

from __future__ import annotations

import gzip
import io
import json
import lzma
import os
import random
import subprocess
import sys
import tarfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PY = sys.executable

_WORDS = ("the model data token shard corpus reads writes quickly across many nodes while a "
          "validation stream stays held out and every document ends with an end marker résumé "
          "naïve café 東京 données größe 🙂").split()


def make_text(rng: random.Random, n_words: int) -> str:
    """English-ish text with runs of 1-4 newlines (so normalisation has work to do)."""
    out = []
    for _ in range(n_words):
        out.append(rng.choice(_WORDS))
        r = rng.random()
        out.append("\n" * rng.randint(1, 4) if r < 0.05 else ("  " if r < 0.07 else " "))
    return "  " + "".join(out) + "\n\n"


def make_docs(n: int, seed: int = 0, min_words: int = 5, max_words: int = 120) -> list[str]:
    """n raw (un-normalised) documents."""
    rng = random.Random(seed)
    return [make_text(rng, rng.randint(min_words, max_words)) for _ in range(n)]


def _xz_tar_of_txt(docs: list[str], prefix: str) -> bytes:
    """An `urlsf_subset*.xz`-shaped blob: an xz-compressed tar of .txt documents."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as tf:
        for j, d in enumerate(docs):
            data = d.encode("utf-8")
            ti = tarfile.TarInfo(f"{prefix}-{j:04d}.txt")
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def write_owt_dir(root: str, groups: list[list[str]]) -> str:
    """The original OpenWebText layout: a directory of urlsf_subset*.xz files."""
    os.makedirs(root, exist_ok=True)
    for i, g in enumerate(groups):
        with open(os.path.join(root, f"urlsf_subset00-{i + 1}_data.xz"), "wb") as fh:
            fh.write(_xz_tar_of_txt(g, f"{i:04d}"))
    return root


def write_owt_plain_tar(path: str, groups: list[list[str]], outer_mode: str = "w") -> str:
    """HF's older layout (plain tar of .xz members), or with outer_mode 'w:xz' the whole openwebtext.tar.xz."""
    with tarfile.open(path, outer_mode) as tf:
        for i, g in enumerate(groups):
            data = _xz_tar_of_txt(g, f"{i:04d}")
            ti = tarfile.TarInfo(f"openwebtext/urlsf_subset00-{i + 1}_data.xz")
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    return path


def write_jsonl(path: str, docs: list[str], key: str = "text") -> str:
    """JSONL (plain, .gz or .zst by suffix)."""
    data = "".join(json.dumps({key: d, "id": i}) + "\n" for i, d in enumerate(docs)).encode()
    if path.endswith(".gz"):
        data = gzip.compress(data)
    elif path.endswith(".zst"):
        import zstandard

        data = zstandard.ZstdCompressor().compress(data)
    with open(path, "wb") as fh:
        fh.write(data)
    return path


def write_parquet(path: str, docs: list[str], row_group_size: int = 7) -> str:
    """A HF-style parquet shard with a `text` column and several row groups."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": docs}), path, row_group_size=row_group_size)
    return path


def write_arrow_stream(path: str, docs: list[str]) -> str:
    """An Arrow IPC stream file, as Hugging Face `datasets` writes its cache."""
    import pyarrow as pa

    table = pa.table({"text": docs})
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
        for b in table.to_batches(max_chunksize=5):
            w.write_batch(b)
    return path


def write_txt_dir(root: str, docs: list[str]) -> str:
    """A directory of .txt documents."""
    os.makedirs(root, exist_ok=True)
    for i, d in enumerate(docs):
        with open(os.path.join(root, f"doc{i:04d}.txt"), "w", encoding="utf-8") as fh:
            fh.write(d)
    return root


def train_bytelevel(out_dir: str, vocab_size: int = 400) -> str:
    """A small byte-level BPE (lossless, so decode(encode(x)) == x) trained on fixture text."""
    from data_prep.train_tokenizer import train_tokenizer

    src = write_txt_dir(os.path.join(out_dir, "tok_src"), make_docs(60, seed=99))
    return train_tokenizer([src], os.path.join(out_dir, "tok"), "bytelevel-bpe", vocab_size)


def run_cli(args: list[str], timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    """`python -m data_prep ARGS` in a subprocess, with a timeout so a hang fails the test."""
    env = dict(os.environ, PYTHONPATH=REPO, PYTHONWARNINGS="ignore")
    return subprocess.run([PY, "-m", "data_prep", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout, **kw)


def read_prefix_docs(prefix: str) -> list:
    """Every document of a .bin/.idx pair as a list of token lists, via Megatron's IndexedDataset."""
    from data_prep.writer import megatron_indexed

    ds = megatron_indexed().IndexedDataset(prefix, mmap=True)
    return [ds[i].tolist() for i in range(len(ds))]


def output_files(out_dir: str) -> dict[str, bytes]:
    """name -> bytes of every .bin/.idx under out_dir (manifests excluded: they hold paths and timings)."""
    res = {}
    for f in sorted(os.listdir(out_dir)):
        if f.endswith((".bin", ".idx")):
            with open(os.path.join(out_dir, f), "rb") as fh:
                res[f] = fh.read()
    return res


def the_error_line(r: subprocess.CompletedProcess) -> str:
    """The single error line; fails if the run did not exit 2 or printed a traceback."""
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    errors = [line for line in r.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, r.stderr
    return errors[0]
