"""What a build's output depends on, hashed for resume, and a readable account of what changed.

The fingerprint covers the output-affecting settings (the --normalize rule included), the
tokenizer's files, the unit plan, and every input file's size, modification time and sampled
content hash (see checksums.sampled_sha256). Work files, finished shards and the manifest are
reused only under the same fingerprint.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
from typing import Optional

from data_prep.checksums import sampled_sha256
from data_prep.units import Unit


def input_files(units: list[Unit]) -> list[tuple[str, str]]:
    """Every distinct input file behind `units` as (absolute path, display name), in unit order."""
    seen: dict[str, str] = {}
    for unit in units:
        for path, name in (unit.files or [(unit.path, unit.name)]):
            seen.setdefault(path, name)
    return list(seen.items())


def file_identity(path: str, name: str) -> dict:
    """Size, modification time and sampled content hash of one input file."""
    st = os.stat(path)
    return {"name": name, "path": path, "bytes": st.st_size, "mtime_ns": st.st_mtime_ns,
            "sampled_sha256": sampled_sha256(path)}


def build_state(version: int, settings: dict, tokenizer_sha256: str, units: list[Unit]) -> dict:
    """Everything the fingerprint covers, kept (in plan.json and the manifest) to explain a later mismatch."""
    return {"version": version, "settings": settings, "tokenizer_sha256": tokenizer_sha256,
            "units": [u.describe() for u in units],
            "files": [file_identity(path, name) for path, name in input_files(units)]}


def fingerprint(state: dict) -> str:
    """SHA-256 of a build state."""
    return hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()


def _when(ns: int) -> str:
    return datetime.datetime.fromtimestamp(ns / 1e9).isoformat(sep=" ", timespec="seconds")


def _file_changes(old: list[dict], new: list[dict]) -> list[str]:
    before = {f["path"]: f for f in old}
    after = {f["path"]: f for f in new}
    out = [f"{f['name']}: new input" for p, f in after.items() if p not in before]
    out += [f"{f['name']}: no longer an input" for p, f in before.items() if p not in after]
    for path, now in after.items():
        was = before.get(path)
        if was is None:
            continue
        what = []
        if was["bytes"] != now["bytes"]:
            what.append(f"size {was['bytes']} -> {now['bytes']} bytes")
        if was["sampled_sha256"] != now["sampled_sha256"]:
            what.append(f"content changed (sampled sha256 {was['sampled_sha256'][:12]} -> {now['sampled_sha256'][:12]})")
        if was["mtime_ns"] != now["mtime_ns"]:
            what.append(f"modification time changed ({_when(was['mtime_ns'])} -> {_when(now['mtime_ns'])})")
        if what:
            out.append(f"{now['name']}: " + ", ".join(what))
    return out


def describe_changes(old: Optional[dict], new: dict) -> list[str]:
    """Human-readable differences between a previous build state and the current one."""
    if not old or "files" not in old:
        return ["the previous build recorded no input fingerprint (written by an older data_prep)"]
    out = []
    if old.get("version") != new["version"]:
        out.append(f"manifest format {old.get('version')} -> {new['version']}")
    if old.get("tokenizer_sha256") != new["tokenizer_sha256"]:
        out.append("tokenizer files changed (sha256 "
                   f"{str(old.get('tokenizer_sha256'))[:12]} -> {new['tokenizer_sha256'][:12]})")
    old_settings = old.get("settings", {})
    for key, value in new["settings"].items():
        if old_settings.get(key) != value:
            out.append(f"setting {key}: {old_settings.get(key)!r} -> {value!r}")
    out += _file_changes(old["files"], new["files"])
    if not out and old.get("units") != new["units"]:
        out.append("the inputs are cut into different work units (data_prep version changed)")
    return out or ["the build fingerprint differs (no single difference found)"]
