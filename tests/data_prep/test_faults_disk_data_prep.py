"""`data_prep build` on a real full or read-only disk (issue 23): exit 2, one line naming the output path, the space
written vs free and the fix, no `.partial`/`.tmp` files left, earlier outputs byte-identical (sha256 before/after),
and the same command resumes once there is room. Real tmpfs mounts (`small_disk`, root as in `make test`);
~40 s per big build on 2 loaded cores."""

from __future__ import annotations

import subprocess

import pytest

from conftest import file_hashes
from test_data_prep_helpers import make_docs, run_cli, the_error_line, train_bytelevel, write_jsonl

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def tok_path(tmp_path_factory):
    return train_bytelevel(str(tmp_path_factory.mktemp("tok")))


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """A small corpus (~10 kB of shards) and a big one (~740 kB of work files, as much again of shards)."""
    root = tmp_path_factory.mktemp("corpora")
    return {"small": write_jsonl(str(root / "small.jsonl"), make_docs(20, seed=1)),
            "big": write_jsonl(str(root / "big.jsonl"), make_docs(2000, seed=3, min_words=100, max_words=200))}


def build(src, tok, prefix) -> subprocess.CompletedProcess:
    return run_cli(["build", "--tokenizer", str(tok), "--data-prefix", str(prefix), "--no-progress",
                    "--num-shards", "2", "--input", str(src)], timeout=300)


def partials(directory) -> list[str]:
    return sorted(str(p) for p in directory.rglob("*") if ".partial" in p.name or ".tmp" in p.name)


@pytest.mark.slow  # two builds
def test_full_disk_while_tokenising_removes_the_partial_file_and_keeps_the_earlier_build(tok_path, corpora,
                                                                                         small_disk):
    disk = small_disk("512k")
    assert build(corpora["small"], tok_path, disk.path / "a" / "small").returncode == 0
    before = file_hashes(disk.path / "a")

    line = the_error_line(build(corpora["big"], tok_path, disk.path / "b" / "big"))

    assert f"{disk.path}/b/.big_work/u000000.tok: No space left on device while writing" in line
    # the size a tokenised unit needs is not known in advance: said so, with what was written and what is free
    assert "size needed unknown: " in line and "written before the failure, removed since; " in line
    assert " free now)" in line and "needs more than" not in line
    assert "removed the partial u000000.tok.partial" in line and "--data-prefix" in line
    assert partials(disk.path) == []
    assert file_hashes(disk.path / "a") == before


@pytest.mark.slow  # two big builds
def test_full_disk_while_writing_shards_keeps_the_work_and_the_same_command_resumes(tok_path, corpora, small_disk):
    disk = small_disk("1m")  # the work files fit, the shards do not
    prefix = disk.path / "out" / "big"

    line = the_error_line(build(corpora["big"], tok_path, prefix))

    assert f"{disk.path}/out/big_0000" in line and "_text_document.bin: No space left on device" in line
    assert "removed the partial" in line and "finished work is kept and resumed" in line
    assert partials(disk.path) == []
    work = file_hashes(disk.path / "out" / ".big_work")
    assert "u000000.tok" in work, "tokenised work survives for the resume"
    subprocess.run(["mount", "-o", "remount,size=4m", str(disk.path)], check=True, timeout=30)
    resumed = build(corpora["big"], tok_path, prefix)
    assert resumed.returncode == 0, resumed.stderr
    assert "(1 already done on rank 0)" in resumed.stderr


def test_read_only_output_disk_is_one_line_exit_2_and_touches_nothing(tok_path, corpora, small_disk):
    disk = small_disk("512k")
    assert build(corpora["small"], tok_path, disk.path / "a" / "small").returncode == 0
    before = file_hashes(disk.path)
    disk.read_only()

    line = the_error_line(build(corpora["small"], tok_path, disk.path / "b" / "small"))

    assert f"{disk.path}/b" in line and "Read-only file system while writing" in line
    assert "fix: make" in line and "writable" in line and "--data-prefix" in line
    assert file_hashes(disk.path) == before


def test_a_complete_build_rerun_on_a_read_only_disk_says_read_only_not_a_larger_disk(tok_path, corpora, small_disk):
    disk = small_disk("512k")
    prefix = disk.path / "a" / "small"
    assert build(corpora["small"], tok_path, prefix).returncode == 0
    before = file_hashes(disk.path)
    disk.read_only()

    line = the_error_line(build(corpora["small"], tok_path, prefix))

    assert "Read-only file system while writing" in line and "writable disk" in line, line
    assert "larger disk" not in line and "free space" not in line, line
    assert file_hashes(disk.path) == before


def test_a_data_prefix_name_over_255_bytes_is_one_line_naming_its_length(tok_path, corpora, tmp_path):
    name = "n" * 300  # one path component over NAME_MAX: ENAMETOOLONG from the first file the build writes
    line = the_error_line(build(corpora["small"], tok_path, tmp_path / name / "small"))
    assert "a name in the path is 300 bytes, longer than the filesystem allows (255)" in line, line
    assert "fix: shorten it" in line and "larger disk" not in line, line
    assert list(tmp_path.iterdir()) == []


def test_embedded_corpus_on_a_full_disk_names_the_output_and_the_fix(small_disk):
    disk = small_disk("256k")
    line = the_error_line(run_cli(["embedded-corpus", "--output", str(disk.path / "corpus"), "--max-bytes",
                                   "1000000"], timeout=120))
    assert f"corpus output ({disk.path}/corpus): No space left on device while writing" in line
    assert "--output on a larger disk" in line


def test_train_tokenizer_into_a_read_only_disk_names_the_output_and_the_fix(corpora, small_disk):
    disk = small_disk("256k")
    disk.read_only()
    line = the_error_line(run_cli(["train-tokenizer", "--input", corpora["small"], "--output", str(disk.path / "tok"),
                                   "--kind", "bytelevel-bpe", "--vocab-size", "300"], timeout=120))
    assert f"tokenizer output ({disk.path}/tok): Read-only file system while writing" in line
