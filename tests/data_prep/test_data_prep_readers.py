"""Readers: every supported layout streams the same documents (OpenWebText archives normalised, the rest as stored);
bad input is named and counted."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

from data_prep.readers import iter_unit, normalize
from data_prep.units import Unit, plan_units
from test_data_prep_helpers import (make_docs, write_arrow_stream, write_jsonl, write_owt_dir,
                                    write_owt_plain_tar, write_parquet, write_txt_dir)


def read_all(inputs, fmt="auto", **kw) -> list:
    return [r for u in plan_units(inputs, fmt, **kw) for r in iter_unit(u)]


def texts(records) -> list[str]:
    return [r.text for r in records if r.text is not None]


def test_normalize_collapses_three_or_more_newlines_and_strips():
    assert normalize("  a\n\n\n\nb\n\nc\nd\n\n\n") == "a\n\nb\n\nc\nd"


@pytest.fixture(scope="module")
def docs():
    return make_docs(30, seed=1)


def test_owt_directory_of_xz_tars_yields_every_document(tmp_path, docs):
    root = write_owt_dir(str(tmp_path / "owt"), [docs[:10], docs[10:20], docs[20:]])
    assert texts(read_all([root])) == [normalize(d) for d in docs]


def test_owt_plain_tar_of_xz_members_is_split_per_member_and_complete(tmp_path, docs):
    path = write_owt_plain_tar(str(tmp_path / "subsets.tar"), [docs[:10], docs[10:20], docs[20:]])
    units = plan_units([path])
    assert [u.member for u in units] == [f"openwebtext/urlsf_subset00-{i}_data.xz" for i in (1, 2, 3)]
    assert texts(read_all([path])) == [normalize(d) for d in docs]


def test_whole_openwebtext_tar_xz_is_read(tmp_path, docs):
    path = write_owt_plain_tar(str(tmp_path / "openwebtext.tar.xz"), [docs[:15], docs[15:]], outer_mode="w:xz")
    assert texts(read_all([path])) == [normalize(d) for d in docs]


def test_jsonl_plain_gz_and_zst_give_identical_documents(tmp_path, docs):
    got = [texts(read_all([write_jsonl(str(tmp_path / f"d.jsonl{ext}"), docs)])) for ext in ("", ".gz", ".zst")]
    assert got[0] == got[1] == got[2] == docs


def test_jsonl_document_keys_do_not_depend_on_chunk_size(tmp_path, docs):
    path = write_jsonl(str(tmp_path / "d.jsonl"), docs)
    whole = read_all([path], chunk_bytes=1 << 30)
    chunked = read_all([path], chunk_bytes=500)
    assert len(plan_units([path], chunk_bytes=500)) > 5
    assert [(r.key, r.text) for r in chunked] == [(r.key, r.text) for r in whole]


def test_jsonl_key_is_chosen_by_flag(tmp_path, docs):
    path = write_jsonl(str(tmp_path / "d.jsonl"), docs[:3], key="content")
    assert texts(read_all([path], jsonl_key="content")) == docs[:3]


def test_parquet_row_groups_become_units_and_keep_order(tmp_path, docs):
    path = write_parquet(str(tmp_path / "train-00000-of-00001.parquet"), docs, row_group_size=7)
    assert len(plan_units([path])) == 5
    assert texts(read_all([path])) == docs


def test_arrow_stream_file_is_read(tmp_path, docs):
    path = write_arrow_stream(str(tmp_path / "data-00000-of-00001.arrow"), docs)
    assert texts(read_all([path])) == docs


def test_txt_directory_is_read_in_sorted_order(tmp_path, docs):
    root = write_txt_dir(str(tmp_path / "txt"), docs)
    assert texts(read_all([root])) == docs


def test_format_flag_forces_reader(tmp_path, docs):
    path = tmp_path / "corpus.data"
    write_jsonl(str(path), docs[:4])
    with pytest.raises(ValueError, match="no corpus files"):  # unknown suffix is not auto-detected...
        plan_units([str(tmp_path)])
    assert texts(read_all([str(path)], fmt="jsonl")) == docs[:4]  # ...but can be forced


def test_bad_jsonl_lines_are_skipped_by_reason_naming_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    lines = [json.dumps({"text": "good one"}).encode(), b'{"text": "bad \xff utf8"}', b"{not json",
             json.dumps({"other": "x"}).encode(), json.dumps({"text": ""}).encode(),
             json.dumps({"text": "good two"}).encode()]
    path.write_bytes(b"\n".join(lines) + b"\n")
    recs = read_all([str(path)])
    assert texts(recs) == ["good one", "good two"]
    skips = [(r.skip_reason, r.where) for r in recs if r.skip_reason]
    assert skips == [("invalid_utf8", "bad.jsonl:line 2"), ("invalid_json", "bad.jsonl:line 3"),
                     ("missing_key", "bad.jsonl:line 4"), ("empty", "bad.jsonl:line 5")]


def test_whitespace_only_document_is_kept_as_stored_and_empty_under_the_owt_rule(tmp_path):
    path = write_jsonl(str(tmp_path / "ws.jsonl"), [" \n\n \n", "x"])
    assert texts(read_all([path])) == [" \n\n \n", "x"]
    recs = read_all([path], normalize="owt")
    assert texts(recs) == ["x"] and [r.skip_reason for r in recs] == ["empty", None]


def test_normalize_flag_applies_the_owt_rule_to_any_format_and_none_to_owt_archives(tmp_path, docs):
    path = write_jsonl(str(tmp_path / "d.jsonl"), docs[:5])
    assert texts(read_all([path], normalize="owt")) == [normalize(d) for d in docs[:5]]
    root = write_owt_dir(str(tmp_path / "owt"), [docs[:5]])
    assert texts(read_all([root], normalize="none")) == docs[:5]


def test_truncated_gzip_reports_corrupt_archive_after_reading_what_it_can(tmp_path, docs):
    path = tmp_path / "t.jsonl.gz"
    data = gzip.compress("".join(json.dumps({"text": d}) + "\n" for d in docs).encode())
    path.write_bytes(data[: len(data) // 2])
    recs = read_all([str(path)])
    assert 0 < len(texts(recs)) < len(docs)
    assert recs[-1].skip_reason == "corrupt_archive" and "t.jsonl.gz" in recs[-1].where


def test_corrupt_inner_xz_is_reported_with_member_and_other_members_survive(tmp_path, docs):
    root = write_owt_dir(str(tmp_path / "owt"), [docs[:10], docs[10:20]])
    bad = os.path.join(root, "urlsf_subset00-1_data.xz")
    raw = Path(bad).read_bytes()
    Path(bad).write_bytes(raw[:40] + b"\x00" * 64 + raw[104:])  # clobber the compressed stream
    recs = read_all([root])
    assert texts(recs)[-10:] == [normalize(d) for d in docs[10:20]]
    errs = [r for r in recs if r.skip_reason]
    assert errs and errs[0].skip_reason == "corrupt_archive" and "urlsf_subset00-1_data.xz" in errs[0].where


def test_invalid_utf8_txt_member_is_skipped_naming_the_member(tmp_path):
    import io
    import tarfile

    root = tmp_path / "owt"
    root.mkdir()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as tf:
        for name, data in (("a.txt", b"fine text"), ("b.txt", b"broken \xc3\x28 bytes")):
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    (root / "urlsf_subset01-1_data.xz").write_bytes(buf.getvalue())
    recs = read_all([str(root)])
    assert texts(recs) == ["fine text"]
    assert [(r.skip_reason, r.where) for r in recs if r.skip_reason] == [
        ("invalid_utf8", "owt/urlsf_subset01-1_data.xz:b.txt")]


def test_unreadable_file_becomes_a_named_skip_record(tmp_path):
    unit = Unit("jsonl", str(tmp_path / "gone.jsonl"), "gone.jsonl", 0)
    (rec,) = list(iter_unit(unit))
    assert rec.skip_reason == "unreadable_file" and rec.where == "gone.jsonl"


BAD_UTF8 = b"broken \xc3\x28 bytes \xff\xfe, and a U+FFFD stored as such: \xef\xbf\xbd"  # 3 invalid sequences


def test_invalid_utf8_txt_file_is_skipped_with_a_fix_for_text_files(tmp_path):
    (tmp_path / "txt").mkdir()
    (tmp_path / "txt" / "a.txt").write_text("fine text")
    (tmp_path / "txt" / "b.txt").write_bytes(BAD_UTF8)
    recs = read_all([str(tmp_path / "txt")])
    assert texts(recs) == ["fine text"]
    (bad,) = [r for r in recs if r.skip_reason]
    assert bad.skip_reason == "invalid_utf8" and bad.where == "txt/b.txt"
    assert "whole file is one document" in bad.message and "--invalid-utf8 replace" in bad.message
    assert "iconv" in bad.message and "--jsonl-key" not in bad.message


def test_invalid_utf8_replace_keeps_the_txt_file_and_counts_each_bad_sequence(tmp_path):
    (tmp_path / "txt").mkdir()
    (tmp_path / "txt" / "b.txt").write_bytes(BAD_UTF8)
    (rec,) = read_all([str(tmp_path / "txt")], invalid_utf8="replace")
    assert rec.text == BAD_UTF8.decode("utf-8", errors="replace") and rec.replacements == 3


def test_invalid_utf8_replace_keeps_a_jsonl_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'{"text": "good"}\n{"text": "bad \xff utf8"}\n')
    skipped, replaced = read_all([str(path)]), read_all([str(path)], invalid_utf8="replace")
    assert [r.skip_reason for r in skipped] == [None, "invalid_utf8"] and "repair the line" in skipped[1].message
    assert texts(replaced) == ["good", "bad \ufffd utf8"] and [r.replacements for r in replaced] == [0, 1]


def test_an_unknown_invalid_utf8_mode_is_refused(tmp_path):
    with pytest.raises(ValueError, match="--invalid-utf8 'ignore'"):
        read_all([write_jsonl(str(tmp_path / "d.jsonl"), ["x"])], invalid_utf8="ignore")
