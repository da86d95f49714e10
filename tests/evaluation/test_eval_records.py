"""`eval run` writes one record per model: re-evaluating a model replaces its record, another model of the same
name is refused in one line (pretrain.evaluation.cli)."""

import json

import pytest

from pretrain.evaluation.cli import _check_record_is_ours


def write(path, source):
    path.write_text(json.dumps({"run": path.stem, "source": str(source)}))
    return path


def test_a_record_of_another_model_with_the_same_name_is_refused_naming_the_fix(tmp_path):
    record = write(tmp_path / "run.json", tmp_path / "first_run")
    with pytest.raises(ValueError, match=r"holds the record of .*first_run, another model named 'run'; pass --name"):
        _check_record_is_ours(record, str(tmp_path / "second_run"))


def test_the_same_models_record_may_be_replaced(tmp_path):
    record = write(tmp_path / "run.json", tmp_path / "runs" / ".." / "first_run")
    _check_record_is_ours(record, str(tmp_path / "first_run"))


def test_no_record_yet_is_fine(tmp_path):
    _check_record_is_ours(tmp_path / "run.json", str(tmp_path / "first_run"))
