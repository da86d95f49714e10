"""Resume trusts nothing stale: inputs edited in place, touched inputs and a changed --normalize all rebuild.

Runtime ~10 s.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from data_prep.checksums import sampled_sha256
from data_prep.pipeline import BuildConfig, build
from test_data_prep_helpers import make_docs, output_files, train_bytelevel, write_jsonl


@pytest.fixture(scope="module")
def tok_path(tmp_path_factory):
    return train_bytelevel(str(tmp_path_factory.mktemp("tok")))


def run_build(src, tok, prefix, **kw) -> dict:
    return build(BuildConfig(inputs=[str(src)], tokenizer=tok, output_prefix=str(prefix), valid_docs=2,
                             progress=False, **kw))


def edit_in_place_keeping_size_and_mtime(path) -> None:
    """Swap one letter of the corpus without changing its size or modification time."""
    st = os.stat(path)
    data = bytearray(Path(path).read_bytes())
    i = data.index(b"model")
    data[i:i + 5] = b"MODEL"
    Path(path).write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.path.getsize(path) == st.st_size


def test_input_edited_in_place_at_the_same_size_is_named_and_rebuilt(tok_path, tmp_path, capsys):
    src = write_jsonl(str(tmp_path / "d.jsonl"), make_docs(30, seed=1))
    run_build(src, tok_path, tmp_path / "o" / "c")
    edit_in_place_keeping_size_and_mtime(src)
    capsys.readouterr()
    run_build(src, tok_path, tmp_path / "o" / "c")
    err = capsys.readouterr().err
    assert "already complete" not in err
    assert "d.jsonl: content changed" in err and "rebuilding" in err
    run_build(src, tok_path, tmp_path / "fresh" / "c")
    assert output_files(tmp_path / "o") == output_files(tmp_path / "fresh")


def test_touched_input_is_reported_as_modified_and_rebuilt(tok_path, tmp_path, capsys):
    src = write_jsonl(str(tmp_path / "d.jsonl"), make_docs(30, seed=1))
    run_build(src, tok_path, tmp_path / "o" / "c")
    st = os.stat(src)
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    capsys.readouterr()
    run_build(src, tok_path, tmp_path / "o" / "c")
    err = capsys.readouterr().err
    assert "d.jsonl: modification time changed" in err and "already complete" not in err


def test_unchanged_inputs_still_resume_as_complete(tok_path, tmp_path, capsys):
    src = write_jsonl(str(tmp_path / "d.jsonl"), make_docs(30, seed=1))
    run_build(src, tok_path, tmp_path / "o" / "c")
    capsys.readouterr()
    run_build(src, tok_path, tmp_path / "o" / "c")
    assert "already complete" in capsys.readouterr().err


def test_changing_normalize_invalidates_resume_and_names_the_setting(tok_path, tmp_path, capsys):
    src = write_jsonl(str(tmp_path / "d.jsonl"), make_docs(30, seed=1))
    run_build(src, tok_path, tmp_path / "o" / "c", normalize="none")
    none_files = output_files(tmp_path / "o")
    capsys.readouterr()
    run_build(src, tok_path, tmp_path / "o" / "c", normalize="owt")
    err = capsys.readouterr().err
    assert "setting normalize: 'none' -> 'owt'" in err and "already complete" not in err
    assert output_files(tmp_path / "o") != none_files


def test_sampled_hash_sees_edits_in_the_first_middle_and_last_mebibyte(tmp_path):
    size = 7 << 20
    path = tmp_path / "big"
    path.write_bytes(bytes(size))
    base = sampled_sha256(str(path))
    for offset in (10, size // 2, size - 10):
        with open(path, "r+b") as fh:
            fh.seek(offset)
            fh.write(b"\x01")
        changed = sampled_sha256(str(path))
        assert changed != base
        base = changed
