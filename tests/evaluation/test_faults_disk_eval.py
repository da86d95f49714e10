"""Evaluation outputs on a real read-only or full disk (issue 23): `eval` says so before evaluating anything
(exit 2, one line), and a record is written atomically, so a full disk leaves the previous record byte-identical
and no temporary file. Real tmpfs mounts (`small_disk`, root as in `make test`); a few seconds."""

import pytest

from conftest import file_hashes
from pretrain.faults import OutputSpaceError
from pretrain.evaluation.cli import eval_cli
from pretrain.evaluation.report import write_record

pytestmark = pytest.mark.timeout(120)


def test_eval_run_to_a_read_only_out_directory_fails_before_evaluating(small_disk, tmp_path, capsys):
    disk = small_disk("256k")
    disk.read_only()
    # the model does not even exist: the output directory is checked first, before any loading or scoring
    code = eval_cli(["run", str(tmp_path / "no_model"), "--data", str(tmp_path / "no_data"), "--lengths", "64",
                     "--output", str(disk.path / "records")])
    assert code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: evaluation output directory ({disk.path}/records): Read-only file system")
    assert "--output on a writable disk" in line and "larger disk" not in line  # more room would not help
    assert file_hashes(disk.path) == {}


def test_eval_all_into_a_full_disk_fails_before_evaluating(small_disk, tmp_path, capsys):
    disk = small_disk("256k")
    disk.fill()
    (tmp_path / "runs").mkdir()
    code = eval_cli(["all", str(tmp_path / "runs"), "--lengths", "64", "--output", str(disk.path / "records")])
    assert code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert f"evaluation output directory ({disk.path}/records): No space left on device" in line


def test_a_record_on_a_full_disk_keeps_the_previous_record_and_no_temporary_file(small_disk):
    disk = small_disk("256k")
    path = write_record({"run": "r", "loss": 1.0}, disk.path / "r.json")
    before = file_hashes(disk.path)
    disk.fill()
    with pytest.raises(OutputSpaceError, match=f"evaluation record \\({path}\\): No space left on device"):
        write_record({"run": "r", "loss": 2.0, "pad": "x" * 100_000}, path)
    assert file_hashes(disk.path) == before | {".filler": file_hashes(disk.path)[".filler"]}
    assert sorted(p.name for p in disk.path.iterdir()) == [".filler", "r.json"]
