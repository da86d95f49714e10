"""Errors that reach the user as one line naming the input (or output) and the fix."""

from __future__ import annotations

import errno
import os
from contextlib import contextmanager
from typing import Iterator

# A full disk, an exhausted quota and a file-size limit (RLIMIT_FSIZE with SIGXFSZ ignored) all
# mean the same to the user: this output path cannot grow.
_NO_SPACE = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


class DataError(RuntimeError):
    """Bad input under --strict, or an unusable configuration."""


class OutputSpaceError(DataError):
    """An output could not be written because its filesystem (or a size limit) is full."""


@contextmanager
def naming_output(path: str) -> Iterator[None]:
    """Turn a no-space OSError raised inside the block into an OutputSpaceError naming `path` and the fix.

    Write errors rarely carry a filename (write() and close() do not), so without this the user
    sees "[Errno 28] No space left on device" and no idea which of several disks filled up.
    """
    try:
        yield
    except OSError as e:
        if e.errno not in _NO_SPACE:
            raise
        where = os.path.dirname(os.path.abspath(path))
        raise OutputSpaceError(
            f"{path}: {os.strerror(e.errno)} while writing; fix: free space in {where} (or raise the quota / "
            "file-size limit), or pass an --output-prefix on a larger disk, then rerun the same command "
            "(finished work is kept and resumed)") from None


def one_line(message: str) -> str:
    """`message` with newlines folded, so a library's multi-line error stays one line."""
    return " ".join(message.split())
