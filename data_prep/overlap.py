"""An output must lie apart from the inputs it is made from: writing (or --overwrite replacing) it never
destroys what the command reads."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Union

Inputs = Union[dict, Iterable[tuple]]  # {flag: path} or (flag, path) pairs; a None path is skipped


def _real(path: str | os.PathLike) -> Path:
    return Path(os.path.realpath(os.path.expanduser(os.fspath(path))))


def overlap(output: str | os.PathLike, inputs: Inputs, *,
            inside_ok: bool = False) -> str | None:
    """How `output` overlaps one of `inputs` (flag and path), or None when it lies apart from all
    (with `inside_ok`, a new directory inside an input is allowed: for commands that only add files)."""
    out = _real(output)
    for name, path in (inputs.items() if isinstance(inputs, dict) else inputs):
        if path is None:
            continue
        source = _real(path)
        if out == source:
            return f"is {name} {path} itself"
        if source in out.parents and not inside_ok:
            return f"is inside {name} {path}"
        if out in source.parents:
            return f"contains {name} {path}"
    return None


def check_apart(output: str | os.PathLike, inputs: Inputs,
                flag: str = "--output", *, inside_ok: bool = False) -> None:
    """ValueError (one line, naming both and the fix) when `output` equals, is inside or contains an input."""
    how = overlap(output, inputs, inside_ok=inside_ok)
    if how is not None:
        raise ValueError(f"{flag} {output} {how}: writing there would damage what this command reads; "
                         f"pass a {flag} outside every input")
