"""`export-hf` and `import-hf` on a real full or read-only disk (issue 23): exit 2, one line naming the output,
the space needed vs free and the fix, no `.tmp-export`/`.tmp-import` left, an existing --overwrite target
byte-identical (sha256 before/after). Real tmpfs mounts (`small_disk`, root); ~30 s in all (one tiny training)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))

from conftest import file_hashes  # noqa: E402
from hf_save_checkpoint import tiny_config, train_and_save  # noqa: E402
from pretrain.hf.export import export_cli  # noqa: E402
from pretrain.hf.importer import import_cli  # noqa: E402

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def checkpoint(megatron_world, tmp_path_factory):
    return train_and_save(tiny_config(str(tmp_path_factory.mktemp("ckpt") / "run"), groups=2, untied=False))


@pytest.fixture(scope="module")
def hf_dir(checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("hf") / "hf"
    assert export_cli([checkpoint, "--output", str(out), "--no-tokenizer"]) == 0
    return out


def one_error_line(code, capsys, command) -> str:
    assert code == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error:" in line]  # (transformers' progress bars aside)
    assert "Traceback" not in err and len(errors) == 1 and errors[0].startswith(f"{command}: error: "), err
    return errors[0]


def leftovers(directory) -> list[str]:
    return sorted(p.name for p in Path(directory).iterdir() if ".tmp" in p.name)


def test_export_to_a_full_disk_keeps_the_previous_export_and_leaves_no_partial_directory(checkpoint, hf_dir,
                                                                                        small_disk, capsys):
    disk = small_disk(f"{sum(p.stat().st_size for p in hf_dir.iterdir()) * 3 // 2 // 1024}k")
    code = export_cli([checkpoint, "--output", str(disk.path / "hf"), "--no-tokenizer"])
    assert code == 0, "room for one export"
    capsys.readouterr()
    before = file_hashes(disk.path / "hf")

    code = export_cli([checkpoint, "--output", str(disk.path / "hf"), "--no-tokenizer",
                       "--overwrite"])

    line = one_error_line(code, capsys, "export-hf")
    assert f"the Hugging Face export ({disk.path}/hf): No space left on device while writing" in line
    assert "needs about" in line and "of weights" in line and " free)" in line
    assert "removed the partial hf.tmp-export" in line and "--output on a larger disk" in line
    assert leftovers(disk.path) == []
    assert file_hashes(disk.path / "hf") == before


def test_export_to_a_read_only_disk_is_one_line_exit_2(checkpoint, small_disk, capsys):
    disk = small_disk("1m")
    disk.read_only()
    code = export_cli([checkpoint, "--output", str(disk.path / "hf"), "--no-tokenizer"])
    line = one_error_line(code, capsys, "export-hf")
    assert f"({disk.path}/hf): Read-only file system while writing" in line and f"make {disk.path} writable" in line
    assert file_hashes(disk.path) == {}


def test_import_to_a_full_disk_is_one_line_exit_2_in_import_terms(hf_dir, small_disk, capsys):
    disk = small_disk("256k")
    code = import_cli(["--hf", str(hf_dir), "--output", str(disk.path / "run")])
    line = one_error_line(code, capsys, "import-hf")
    assert f"the imported checkpoint ({disk.path}/run): No space left on device while writing" in line
    assert "removed the partial run.tmp-import" in line and "--output on a larger disk" in line
    assert "checkpoint.save" not in line, "no training-run advice for an import"
    assert leftovers(disk.path) == []
