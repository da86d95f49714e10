"""The one place write faults become our one-line error (pretrain/faults.py): which errors count, and the line."""

import errno
import pickle

import pytest

from pretrain.faults import OutputError, OutputSpaceError, naming_output, output_error, write_fault


@pytest.mark.parametrize("error, code", [
    (OSError(errno.ENOSPC, "No space left on device"), errno.ENOSPC),
    (PermissionError(errno.EROFS, "Read-only file system"), errno.EROFS),
    (RuntimeError("Worker failure: [Errno 28] No space left on device"), errno.ENOSPC),  # Megatron's writer
    (RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)"), errno.ENOSPC),
    (RuntimeError("unexpected pos 704 vs 598"), None),
    (FileNotFoundError(errno.ENOENT, "gone"), errno.ENOENT),
    (ValueError("[Errno 22] Invalid argument"), None),  # not a write fault
], ids=["oserror", "read-only", "megatron-worker-text", "rust-text", "no-errno", "removed", "einval"])
def test_write_fault_finds_the_errno_behind_an_error(error, code):
    assert write_fault(error) == code


def test_write_fault_follows_the_cause_chain():
    try:
        try:
            raise OSError(errno.EDQUOT, "Disk quota exceeded")
        except OSError as inner:
            raise RuntimeError("save failed") from inner
    except RuntimeError as outer:
        assert write_fault(outer) == errno.EDQUOT


def test_output_error_names_the_output_the_space_and_the_fix(tmp_path):
    error = output_error(errno.ENOSPC, tmp_path / "out.bin", what="the shard", needed="about 2 MB",
                         done="removed the partial out.bin.partial", elsewhere="pass --x", then="rerun it")
    assert isinstance(error, OutputSpaceError) and "\n" not in str(error)
    assert str(error).startswith(f"the shard ({tmp_path}/out.bin): No space left on device while writing "
                                 "(needs about 2 MB; ")
    assert "free); removed the partial out.bin.partial; fix: free space in" in str(error)
    assert str(error).endswith("or pass --x, then rerun it")


def test_output_error_survives_a_process_boundary_with_its_errno(tmp_path):
    error = pickle.loads(pickle.dumps(output_error(errno.EROFS, tmp_path / "x")))
    assert type(error) is OutputError and error.errno == errno.EROFS and "Read-only file system" in str(error)


def test_naming_output_removes_partial_files_and_passes_other_errors_through(tmp_path):
    partial = tmp_path / "a.partial"
    partial.write_bytes(b"x" * 1000)
    with pytest.raises(OutputSpaceError, match="size needed unknown: 1.0 kB written before the failure, removed since; .* free now"):
        with naming_output(tmp_path / "a", partial=(str(partial),)):
            raise OSError(errno.ENOSPC, "No space left on device")
    assert not partial.exists()
    with pytest.raises(KeyError):
        with naming_output(tmp_path / "a"):
            raise KeyError("not a write fault")
