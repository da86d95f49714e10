"""`build`: round-trip, Megatron readability, determinism across workers/ranks, resume, accounting."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from data_prep.manifest import load_manifest
from data_prep.pipeline import BuildConfig, DataError, build
from data_prep.readers import normalize
from data_prep.tokenizers import load_tokenizer
from test_data_prep_helpers import (PY, REPO, make_docs, output_files, read_prefix_docs, run_cli, train_bytelevel,
                                    write_jsonl, write_owt_dir, write_parquet)


@pytest.fixture(scope="module")
def tok_path(tmp_path_factory):
    return train_bytelevel(str(tmp_path_factory.mktemp("tok")))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Mixed corpus: an OpenWebText directory, a gz JSONL and a parquet shard (120 documents)."""
    root = tmp_path_factory.mktemp("corpus")
    docs = make_docs(120, seed=3)
    owt = write_owt_dir(str(root / "owt"), [docs[:20], docs[20:40]])
    jl = write_jsonl(str(root / "b.jsonl.gz"), docs[40:80])
    pq = write_parquet(str(root / "c.parquet"), docs[80:], row_group_size=9)
    return [owt, jl, pq], docs


def run_build(inputs, tok, prefix, **kw) -> dict:
    kw.setdefault("progress", False)
    return build(BuildConfig(inputs=list(inputs), tokenizer=tok, output_prefix=str(prefix), **kw))


def all_documents(prefix) -> list[list[int]]:
    m = load_manifest(str(prefix))
    return [d for p in m.train_prefixes + [m.valid_prefix] for d in read_prefix_docs(p)]


def test_decoded_shards_equal_every_input_document_normalised_only_for_openwebtext(corpus, tok_path, tmp_path):
    inputs, docs = corpus
    run_build(inputs, tok_path, tmp_path / "o" / "c", num_shards=3, valid_docs=6)
    tok = load_tokenizer(tok_path)
    got = all_documents(tmp_path / "o" / "c")
    assert all(d[-1] == tok.eod for d in got)
    expected = [normalize(d) for d in docs[:40]] + docs[40:]  # the first 40 come from the OpenWebText archives
    assert sorted(tok.decode(d[:-1]) for d in got) == sorted(expected)


def test_output_files_and_manifest_follow_the_contract(corpus, tok_path, tmp_path):
    inputs, docs = corpus
    man = run_build(inputs, tok_path, tmp_path / "c", num_shards=2, valid_docs=5)
    names = sorted(os.listdir(tmp_path))
    assert names == [".c_build.lock",  # the build's lock stays (pretrain/locks.py says why)
                     "c_00000_text_document.bin", "c_00000_text_document.idx", "c_00001_text_document.bin",
                     "c_00001_text_document.idx", "c_manifest.json", "c_valid_text_document.bin",
                     "c_valid_text_document.idx"]
    m = load_manifest(str(tmp_path / "c"))
    assert m.train_prefixes == [str(tmp_path / f"c_0000{i}_text_document") for i in (0, 1)]
    assert m.valid_prefix == str(tmp_path / "c_valid_text_document")
    tok = load_tokenizer(tok_path)
    assert (m.tokenizer_path, m.vocab_size, m.eod_id) == (tok_path, tok.vocab_size, tok.eod)
    assert m.num_tokens == sum(len(d) for p in m.train_prefixes for d in read_prefix_docs(p))
    assert m.raw == man and man["tokenizer"]["sha256"] == tok.sha256
    assert man["documents"]["valid"] == 5 and man["tokenizer"]["dtype"] == "uint16"
    assert all(len(s["bin_sha256"]) == 64 for s in man["shards"])


def test_megatron_gpt_dataset_reads_the_shards_with_our_tokenizer(corpus, tok_path, tmp_path):
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    inputs, _ = corpus
    run_build(inputs, tok_path, tmp_path / "c", num_shards=2, valid_docs=10)
    m = load_manifest(str(tmp_path / "c"))
    tok = load_tokenizer(m.tokenizer_path)
    signal.alarm(120)  # GPTDataset can loop forever on an empty split: fail instead of hanging
    try:
        cfg = GPTDatasetConfig(random_seed=1, sequence_length=32, blend_per_split=[
            (m.train_prefixes, None), ([m.valid_prefix], None), None], tokenizer=tok,
            reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False,
            path_to_cache=None)  # a cache dir needs torch.distributed initialised
        train, valid, _ = BlendedMegatronDatasetBuilder(GPTDataset, [40, 4, 0], lambda: True, cfg).build()
        sample = train[0]
        assert sample["tokens"].shape == (32,) and (sample["tokens"][1:] == sample["labels"][:-1]).all()
        assert len(valid) >= 4
    finally:
        signal.alarm(0)


def test_one_and_two_workers_write_identical_shards(corpus, tok_path, tmp_path):
    inputs, _ = corpus
    run_build(inputs, tok_path, tmp_path / "w1" / "c", num_shards=3, valid_docs=7, workers=1, chunk_bytes=2000)
    run_build(inputs, tok_path, tmp_path / "w2" / "c", num_shards=3, valid_docs=7, workers=2, chunk_bytes=2000)
    a, b = output_files(tmp_path / "w1"), output_files(tmp_path / "w2")
    assert len(a) == 8 and a == b


def test_valid_split_is_seeded_and_exact(corpus, tok_path, tmp_path):
    inputs, _ = corpus
    runs = {}
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        run_build(inputs, tok_path, tmp_path / name / "c", valid_docs=9, seed=seed)
        runs[name] = read_prefix_docs(str(tmp_path / name / "c_valid_text_document"))
    assert len(runs["a"]) == 9 and runs["a"] == runs["b"] and runs["a"] != runs["c"]
    man = run_build(inputs, tok_path, tmp_path / "f" / "c", valid_fraction=0.1)
    assert man["documents"]["valid"] == 12  # round(0.1 * 120)


def test_bad_input_is_skipped_counted_by_reason_and_accounted(tok_path, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    good = make_docs(10, seed=4)
    lines = [json.dumps({"text": d}) for d in good[:5]] + ['{"text": "\\ud800 lone"', '{"body": "no key"}', "{bad json",
                                                            json.dumps({"text": ""})]
    (src / "a.jsonl").write_bytes("\n".join(lines).encode() + b"\n" + b'{"text": "\xff\xfe"}\n')
    owt = write_owt_dir(str(src / "owt"), [good[5:], good[:2]])
    broken = os.path.join(owt, "urlsf_subset00-2_data.xz")
    Path(broken).write_bytes(Path(broken).read_bytes()[:60])  # truncated archive
    man = run_build([str(src)], tok_path, tmp_path / "o" / "c", valid_docs=1)
    d = man["documents"]
    assert d["written"] == 10 and d["read"] == d["written"] + d["skipped"]
    assert man["skipped_by_reason"] == {"corrupt_archive": 1, "empty": 1, "invalid_json": 2, "invalid_utf8": 1,
                                        "missing_key": 1}
    assert any("urlsf_subset00-2_data.xz" in m and "corrupt_archive" in m for m in man["skipped_examples"])
    assert any("a.jsonl:line 10: invalid_utf8" in m for m in man["skipped_examples"])


def test_strict_turns_the_first_skip_into_an_error_naming_the_file(tok_path, tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text('{"text": "ok"}\n{"oops": 1}\n')
    with pytest.raises(DataError, match=r"a.jsonl:line 2: missing_key"):
        run_build([str(path)], tok_path, tmp_path / "o" / "c", valid_docs=0, strict=True)
    r = run_cli(["build", "--input", str(path), "--tokenizer", tok_path, "--data-prefix", str(tmp_path / "p" / "c"),
                 "--strict", "--valid-docs", "0"], timeout=120)
    assert r.returncode != 0 and "a.jsonl:line 2" in r.stderr


def test_rerun_skips_a_complete_build_and_rebuilds_a_damaged_shard(corpus, tok_path, tmp_path):
    inputs, _ = corpus
    kw = dict(num_shards=2, valid_docs=4)
    run_build(inputs, tok_path, tmp_path / "c", **kw)
    before = output_files(tmp_path)
    t_manifest = os.path.getmtime(tmp_path / "c_manifest.json")
    run_build(inputs, tok_path, tmp_path / "c", **kw)
    assert os.path.getmtime(tmp_path / "c_manifest.json") == t_manifest  # nothing redone
    with open(tmp_path / "c_00001_text_document.bin", "r+b") as fh:
        fh.write(b"\x07\x07")
    run_build(inputs, tok_path, tmp_path / "c", **kw)
    assert output_files(tmp_path) == before


def test_force_rebuilds_everything(corpus, tok_path, tmp_path):
    inputs, _ = corpus
    run_build(inputs, tok_path, tmp_path / "c", valid_docs=4)
    t0 = os.path.getmtime(tmp_path / "c_00000_text_document.bin")
    time.sleep(0.05)
    run_build(inputs, tok_path, tmp_path / "c", valid_docs=4, force=True)
    assert os.path.getmtime(tmp_path / "c_00000_text_document.bin") > t0


@pytest.mark.slow
def test_killed_run_resumes_to_byte_identical_shards(tok_path, tmp_path):
    docs = make_docs(1500, seed=11, min_words=100, max_words=300)
    src = write_jsonl(str(tmp_path / "big.jsonl"), docs)
    args = ["build", "--input", src, "--tokenizer", tok_path, "--num-shards", "2", "--valid-docs", "20",
            "--chunk-bytes", "20000", "--no-progress"]
    run_build([src], tok_path, tmp_path / "ref" / "c", num_shards=2, valid_docs=20, chunk_bytes=20000)

    prefix = str(tmp_path / "res" / "c")
    work = str(tmp_path / "res" / ".c_work")
    env = dict(os.environ, PYTHONPATH=REPO)
    proc = subprocess.Popen([PY, "-m", "data_prep", *args, "--data-prefix", prefix], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:  # kill once some, but not all, units are tokenised
            done = [f for f in os.listdir(work) if f.startswith("u") and f.endswith(".json")] if os.path.isdir(work) else []
            if len(done) >= 3:
                break
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not os.path.exists(prefix + "_manifest.json"), "run finished before it could be killed"
    r = run_cli([*args, "--data-prefix", prefix], timeout=180)
    assert r.returncode == 0, r.stderr
    assert "already done" in r.stderr and " (0 already done" not in r.stderr
    assert output_files(tmp_path / "res") == output_files(tmp_path / "ref")


@pytest.mark.slow
def test_one_and_two_mpi_ranks_write_identical_shards(corpus, tok_path, tmp_path):
    inputs, _ = corpus
    run_build(inputs, tok_path, tmp_path / "r1" / "c", num_shards=3, valid_docs=5, chunk_bytes=2000)
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", PY, "-m", "data_prep", "build",
           "--tokenizer", tok_path, "--data-prefix", str(tmp_path / "r2" / "c"), "--num-shards", "3",
           "--valid-docs", "5", "--chunk-bytes", "2000", "--no-progress"]
    for i in inputs:
        cmd += ["--input", i]
    r = subprocess.run(cmd, cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO), capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "x 2 rank(s)" in r.stderr
    assert output_files(tmp_path / "r2") == output_files(tmp_path / "r1")
    assert load_manifest(str(tmp_path / "r2" / "c")).raw["settings"]["ranks"] == 2


@pytest.mark.slow
def test_inspect_reports_counts_and_detects_a_truncated_bin(corpus, tok_path, tmp_path):
    inputs, _ = corpus
    run_build(inputs, tok_path, tmp_path / "c", num_shards=1, valid_docs=3)
    r = run_cli(["inspect", str(tmp_path / "c")], timeout=120)
    assert r.returncode == 0, r.stderr
    assert "117 documents" in r.stdout and "all shards consistent" in r.stdout and "sample" in r.stdout
    with open(tmp_path / "c_00000_text_document.bin", "r+b") as fh:
        fh.truncate(100)
    r = run_cli(["inspect", str(tmp_path / "c_00000_text_document")], timeout=120)
    assert r.returncode == 1 and "PROBLEM" in r.stdout and ".bin has 100 bytes" in r.stdout


@pytest.mark.slow
def test_inspect_finds_a_build_without_validation_documents_consistent(corpus, tok_path, tmp_path):
    inputs, _ = corpus
    run_build(inputs, tok_path, tmp_path / "c", num_shards=1, valid_docs=0)
    r = run_cli(["inspect", str(tmp_path / "c")], timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "c_valid_text_document: 0 documents" in r.stdout and "all shards consistent" in r.stdout


def test_embedded_corpus_is_deterministic_text(tmp_path):
    for d in ("a", "b"):
        r = run_cli(["embedded-corpus", "--output", str(tmp_path / d), "--max-bytes", "200000"], timeout=120)
        assert r.returncode == 0, r.stderr
    a, b = output_files_txt(tmp_path / "a"), output_files_txt(tmp_path / "b")
    assert a == b and len(a) >= 5
    total = sum(len(v) for v in a.values())
    assert 100_000 < total <= 200_000
    assert all(v.decode("utf-8") == normalize(v.decode("utf-8")) for v in a.values())


def output_files_txt(d) -> dict:
    return {f: Path(d, f).read_bytes() for f in sorted(os.listdir(d))}


def test_background_megatron_import_reraises_its_error_when_waited_on(monkeypatch):
    import data_prep.writer as writer

    def broken_import():
        raise ImportError("megatron.core is not installed")

    monkeypatch.setattr(writer, "megatron_indexed", broken_import)
    wait = writer.import_megatron_in_background()
    with pytest.raises(ImportError, match="megatron.core is not installed"):
        wait()


def _txt_corpus_with_one_bad_file(root: Path) -> str:
    root.mkdir()
    (root / "good.txt").write_text("plain good text")
    (root / "bad.txt").write_bytes(b"bad \xff\xfe bytes and \xc3\x28 here")  # 3 invalid sequences
    return str(root)


def test_invalid_utf8_replace_keeps_the_document_and_counts_replacements_in_summary_and_manifest(
        tok_path, tmp_path, capsys):
    src = _txt_corpus_with_one_bad_file(tmp_path / "txt")
    man = run_build([src], tok_path, tmp_path / "o" / "c", valid_docs=0, invalid_utf8="replace")
    assert man["documents"]["written"] == 2 and man["skipped_by_reason"] == {}
    assert {k: man["invalid_utf8"][k] for k in ("mode", "documents", "replacements")} == \
        {"mode": "replace", "documents": 1, "replacements": 3}
    assert "txt/bad.txt: 3 invalid UTF-8 sequence(s)" in man["invalid_utf8"]["examples"][0]
    assert "invalid UTF-8: 3 byte sequence(s) decoded as U+FFFD in 1 document(s)" in capsys.readouterr().err
    tok = load_tokenizer(tok_path)
    shard = load_manifest(str(tmp_path / "o" / "c")).train_prefixes[0]
    decoded = sorted(tok.decode(d[:-1]) for d in read_prefix_docs(shard))
    assert decoded == ["bad \ufffd\ufffd bytes and \ufffd( here", "plain good text"]
    assert "--invalid-utf8 replace" in load_manifest(str(tmp_path / "o" / "c")).rebuild_command()


def test_invalid_utf8_skip_is_the_default_and_the_summary_says_how_to_keep_them(tok_path, tmp_path, capsys):
    src = _txt_corpus_with_one_bad_file(tmp_path / "txt")
    man = run_build([src], tok_path, tmp_path / "o" / "c", valid_docs=0)
    assert man["documents"]["written"] == 1 and man["skipped_by_reason"] == {"invalid_utf8": 1}
    assert man["invalid_utf8"]["mode"] == "skip" and man["invalid_utf8"]["replacements"] == 0
    assert "invalid UTF-8: 1 document(s) skipped; to keep them pass --invalid-utf8 replace" in capsys.readouterr().err
    assert "--invalid-utf8" not in load_manifest(str(tmp_path / "o" / "c")).rebuild_command()
