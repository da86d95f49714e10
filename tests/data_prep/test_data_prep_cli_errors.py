"""Bad input through the CLI: exit code 2 and one line naming the input and the fix, never a traceback.

Runtime ~15 s (one subprocess per case; the disk-full case mounts a 256 KiB tmpfs, which needs root).
"""

from __future__ import annotations

import json
import subprocess

import pytest

from test_data_prep_helpers import make_docs, run_cli, the_error_line, train_bytelevel, write_jsonl


@pytest.fixture(scope="module")
def tok_path(tmp_path_factory):
    return train_bytelevel(str(tmp_path_factory.mktemp("tok")))


def build_cli(inputs, tok, prefix, *extra):
    args = ["build", "--tokenizer", str(tok), "--data-prefix", str(prefix), "--no-progress", *extra]
    for i in inputs:
        args += ["--input", str(i)]
    return run_cli(args, timeout=180)


def test_malformed_merges_txt_names_the_file_and_the_fix(tok_path, tmp_path):
    from tokenizers import Tokenizer

    tok_dir = tmp_path / "gpt2"
    tok_dir.mkdir()
    Tokenizer.from_file(tok_path).model.save(str(tok_dir))
    with open(tok_dir / "merges.txt", "a") as fh:
        fh.write("three tokens here\n")
    src = write_jsonl(str(tmp_path / "d.jsonl"), ["hello"])
    line = the_error_line(build_cli([src], tok_dir, tmp_path / "o" / "c"))
    assert f"{tok_dir / 'merges.txt'}" in line and "malformed" in line and "fix:" in line


def test_malformed_tokenizer_json_names_the_file_and_the_fix(tmp_path):
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    src = write_jsonl(str(tmp_path / "d.jsonl"), ["hello"])
    line = the_error_line(build_cli([src], bad, tmp_path / "o" / "c"))
    assert str(bad) in line and "fix:" in line


def test_empty_jsonl_names_the_file_and_the_fix(tok_path, tmp_path):
    src = tmp_path / "empty.jsonl"
    src.write_bytes(b"")
    line = the_error_line(build_cli([src], tok_path, tmp_path / "o" / "c"))
    assert "empty.jsonl" in line and "0 documents" in line and "fix:" in line


def test_jsonl_with_only_bad_lines_prints_the_skip_reasons_in_the_error(tok_path, tmp_path):
    src = tmp_path / "wrong_key.jsonl"
    src.write_text("".join(json.dumps({"content": f"doc {i}"}) + "\n" for i in range(3)))
    line = the_error_line(build_cli([src], tok_path, tmp_path / "o" / "c"))
    assert "missing_key: 3" in line and "wrong_key.jsonl:line 1" in line and "--jsonl-key" in line


@pytest.fixture
def tiny_disk(tmp_path):
    """A 256 KiB tmpfs: a real ENOSPC, not a simulated one."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], capture_output=True,
                       text=True, timeout=30)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (needs root): {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], timeout=30)


def test_full_disk_names_the_output_path_and_the_fix(tok_path, tmp_path, tiny_disk):
    src = write_jsonl(str(tmp_path / "big.jsonl"), make_docs(2000, seed=3, min_words=100, max_words=200))
    line = the_error_line(build_cli([src], tok_path, tiny_disk / "c"))
    assert f"{tiny_disk}/" in line and "No space left on device" in line
    assert "fix:" in line and "--data-prefix" in line


def test_file_size_limit_names_the_output_path(tok_path, tmp_path):
    import resource
    import signal

    def limit_file_size():  # writes past the limit fail with EFBIG instead of killing the process
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))

    src = write_jsonl(str(tmp_path / "big.jsonl"), make_docs(2000, seed=3, min_words=100, max_words=200))
    args = ["build", "--tokenizer", tok_path, "--data-prefix", str(tmp_path / "o" / "c"), "--no-progress",
            "--input", src]
    line = the_error_line(run_cli(args, timeout=180, preexec_fn=limit_file_size))
    assert f"{tmp_path / 'o'}/" in line and "File too large" in line and "fix:" in line


def test_txt_input_with_only_invalid_utf8_suggests_the_text_file_fixes(tok_path, tmp_path):
    src = tmp_path / "txt"
    src.mkdir()
    (src / "latin1.txt").write_bytes("caf\u00e9 cr\u00e8me".encode("latin-1"))
    line = the_error_line(build_cli([src], tok_path, tmp_path / "o" / "c"))
    assert "invalid_utf8: 1" in line and "latin1.txt" in line and "--invalid-utf8 replace" in line
    assert "--jsonl-key" not in line


def test_build_without_a_data_prefix_names_the_flag(tok_path, tmp_path):
    src = write_jsonl(str(tmp_path / "d.jsonl"), ["hello"])
    line = the_error_line(run_cli(["build", "--tokenizer", tok_path, "--input", src]))
    assert line.endswith("error: the following arguments are required: --data-prefix")


def test_the_old_output_prefix_still_builds_and_warns_with_the_new_name(tok_path, tmp_path):
    src = write_jsonl(str(tmp_path / "d.jsonl"), make_docs(20))
    proc = run_cli(["build", "--tokenizer", tok_path, "--input", src, "--output-prefix", str(tmp_path / "o" / "c"),
                    "--valid-docs", "1", "--no-progress"], timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert "data_prep: warning: --output-prefix is deprecated: write --data-prefix (the same value)" in proc.stderr
    assert (tmp_path / "o" / "c_manifest.json").is_file()
