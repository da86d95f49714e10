"""Transformer Engine, carried to the GPU machine in parts (issue 58): download here, split, check and join there.

The device machine (Python 3.12, CUDA torch 2.11+cu130, nvcc 13.0, no network) takes at most 64 MiB per call,
checkout included, and keeps git-ignored folders while it stays warm. TE 2.20.2 is three packages: the pure-Python
`transformer_engine`, the 276 MB `transformer_engine_cu13` wheel (too large for one call: split into parts), and
`transformer_engine_torch`, a source distribution compiled there against the local torch. megatron-core and
zstandard travel in `.whl/`, the folder benchmarks/gpu_lease.sh installs from.

Here (network):  python benchmarks/gpu_te/kit.py download     # .gpu_te/ and .whl/ filled, manifest.json written
                 python benchmarks/gpu_lease.py --prepare-data --output .gpu_data   # the battery's data
                 python benchmarks/gpu_te/kit.py plan         # each device call's `carry` and command
There:           python3 benchmarks/gpu_te/kit.py check --partial   # after each transfer: what arrived, intact
                 python3 benchmarks/gpu_te/kit.py join              # every part checked, the wheel rebuilt, checked
A missing or corrupt file is one line naming it and exit 2.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KIT = ".gpu_te"  # git-ignored, beside the checkout's files; the device machine keeps it while warm
DATA = ".gpu_data"  # benchmarks/gpu_lease.sh's data folder: the battery's save + resume step trains on it
BUILD_DATA = f"python benchmarks/gpu_lease.py --prepare-data --output {DATA}"
DEVICE_COMMAND = ("bash benchmarks/gpu_te/device.sh python3 benchmarks/gpu_te/battery.py --preset gpu "
                  f"--data-prefix {DATA}/data/shards/corpus")
WHEELS = ".whl"  # benchmarks/gpu_lease.sh's folder: megatron-core and zstandard
MANIFEST = Path(__file__).resolve().parent / "manifest.json"  # tracked: the checksums travel with the checkout
TE_VERSION = "2.20.2"
PLATFORM_ARGS = ["--python-version", "3.12", "--implementation", "cp", "--only-binary=:all:",
                 "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_27_x86_64",
                 "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64"]
BINARIES = {  # requirement -> folder it lands in
    f"transformer_engine=={TE_VERSION}": f"{KIT}/small",
    f"transformer_engine_cu13=={TE_VERSION}": f"{KIT}/big",
    "megatron_core==0.16.1": WHEELS,
    "zstandard==0.25.0": WHEELS,
}
SDIST = f"transformer_engine_torch-{TE_VERSION}.tar.gz"  # pip cannot download it without building its metadata
MIB = 2**20
CALL_LIMIT = 64 * MIB  # the device tool's limit per call: checkout + carried paths
MARGIN = 2 * MIB
# Left free beside each part when the parts are cut: the checkout grows with every stored result, and parts cut to
# the exact room stopped fitting after one session's evidence (2.7 MB). `plan` refuses a call that no longer fits.
GROWTH = 6 * MIB
CHUNK = MIB


class KitError(Exception):
    """A missing or corrupt file: one line for the user."""


def sha256(path: Path) -> str:
    """The file's sha256, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def split(path: Path, parts_dir: Path, part_bytes: int) -> list[dict]:
    """Cut `path` into files of at most part_bytes under parts_dir; [{name, size, sha256}] in order."""
    parts_dir.mkdir(parents=True, exist_ok=True)
    parts = []
    with open(path, "rb") as source:
        index = 0
        while block := source.read(part_bytes):
            part = parts_dir / f"{path.name}.part{index:02d}"
            part.write_bytes(block)
            parts.append({"name": part.name, "size": len(block), "sha256": hashlib.sha256(block).hexdigest()})
            index += 1
    return parts


def check_file(path: Path, size: int, digest: str, what: str) -> None:
    """Refuse a file that is missing, of another size, or of another sha256."""
    if not path.is_file():
        raise KitError(f"{what} {path} is missing: carry it (python benchmarks/gpu_te/kit.py plan lists each call)")
    if path.stat().st_size != size:
        raise KitError(f"{what} {path} has {path.stat().st_size} bytes, the manifest says {size}: carry it again")
    if sha256(path) != digest:
        raise KitError(f"{what} {path} has another sha256 than the manifest's: carry it again")


def join(manifest: dict, kit: Path) -> list[Path]:
    """Check every part, rebuild each split file under kit/whole and check it; the rebuilt paths."""
    rebuilt = []
    for name, entry in manifest["files"].items():
        if not entry.get("parts"):
            continue
        for part in entry["parts"]:
            check_file(kit / "parts" / part["name"], part["size"], part["sha256"], "part")
        target = kit / "whole" / name
        if target.is_file() and target.stat().st_size == entry["size"] and sha256(target) == entry["sha256"]:
            rebuilt.append(target)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "wb") as out:
            for part in entry["parts"]:
                with open(kit / "parts" / part["name"], "rb") as handle:
                    while block := handle.read(CHUNK):
                        out.write(block)
        check_file(target, entry["size"], entry["sha256"], "reassembled file")
        rebuilt.append(target)
    return rebuilt


def check(manifest: dict, kit: Path, partial: bool) -> tuple[int, int]:
    """Check every whole file and part present (all of them unless partial); (present, expected). A whole file's
    folder is relative to the kit's parent (the checkout: .gpu_te/small, .whl)."""
    present = expected = 0
    for name, entry in manifest["files"].items():
        pieces = ([(kit / "parts" / p["name"], p["size"], p["sha256"]) for p in entry["parts"]] if entry.get("parts")
                  else [(kit.parent / entry["folder"] / name, entry["size"], entry["sha256"])])
        for path, size, digest in pieces:
            expected += 1
            if partial and not path.exists():
                continue
            check_file(path, size, digest, "part" if entry.get("parts") else "file")
            present += 1
    return present, expected


def room_per_call() -> int:
    """Bytes one call can carry beside the checkout (tracked and untracked-not-ignored files)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.split(b"\0")
    tree = sum((ROOT / name.decode()).stat().st_size for name in listed if name and (ROOT / name.decode()).is_file())
    return CALL_LIMIT - tree - MARGIN


def transfers(manifest: dict, room: int) -> list[list[str]]:
    """The device calls' carry lists: one part per call, the small folders with the call that has room for them."""
    calls: list[tuple[int, list[str]]] = []
    for entry in manifest["files"].values():
        for part in entry.get("parts") or []:
            calls.append((part["size"], [f"{KIT}/parts/{part['name']}"]))
    small = sum(e["size"] for e in manifest["files"].values() if not e.get("parts"))
    folders = sorted({e["folder"] for e in manifest["files"].values() if not e.get("parts")})
    fits = [i for i, (size, _) in enumerate(calls) if size + small <= room]
    if fits:
        calls[fits[-1]][1].extend(folders)
        calls[fits[-1]] = (calls[fits[-1]][0] + small, calls[fits[-1]][1])
    else:
        calls.append((small, folders))
    return [paths for _, paths in calls]


def folder_bytes(folder: Path) -> int:
    """Bytes of the files under `folder`."""
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def carried_sizes(manifest: dict) -> dict[str, int]:
    """Bytes of each path a device call carries: every part, and each folder of whole files."""
    sizes = {f"{KIT}/parts/{p['name']}": p["size"] for e in manifest["files"].values() for p in e.get("parts", [])}
    for entry in manifest["files"].values():
        if not entry.get("parts"):
            sizes[entry["folder"]] = sizes.get(entry["folder"], 0) + entry["size"]
    return sizes


def device_calls(manifest: dict, data: Path) -> list[list[str]]:
    """The manifest's calls with the battery's data folder added to the last, or carried alone just before it when
    the last is full; refused when the data is absent or any call is larger than the room beside the checkout."""
    if not (data / "data" / "shards").is_dir():
        raise KitError(f"{data} holds no data/shards: build it here with `{BUILD_DATA}`")
    calls = [list(paths) for paths in manifest["transfers"]]
    sizes, room = {**carried_sizes(manifest), DATA: folder_bytes(data)}, room_per_call()
    if sum(sizes[path] for path in calls[-1]) + sizes[DATA] <= room:
        calls[-1].append(DATA)
    else:
        calls.insert(len(calls) - 1, [DATA])
    for index, paths in enumerate(calls, 1):
        carried = sum(sizes[path] for path in paths)
        if carried > room:
            raise KitError(f"device call {index} would carry {carried / MIB:.1f} MiB, more than the {room / MIB:.1f} "
                           f"MiB one call has beside this checkout: cut the parts again with `python "
                           f"benchmarks/gpu_te/kit.py download --part-mib {max(1, (room - GROWTH) // MIB)}`")
    return calls


def fetch_sdist(dest: Path) -> dict:
    """The transformer_engine_torch sdist from PyPI's simple index, checked against the index's sha256."""
    request = urllib.request.Request("https://pypi.org/simple/transformer-engine-torch/",
                                     headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        entry = next(f for f in json.load(response)["files"] if f["filename"] == SDIST)
    dest.mkdir(parents=True, exist_ok=True)
    urllib.request.urlretrieve(entry["url"], dest / SDIST)
    if sha256(dest / SDIST) != entry["hashes"]["sha256"]:
        raise KitError(f"{dest / SDIST}: sha256 differs from PyPI's index; download again")
    return entry


def download(part_bytes: int | None) -> dict:
    """Download every package, split the large wheel, write the manifest; the manifest."""
    files = {}
    for requirement, folder in BINARIES.items():
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", *PLATFORM_ARGS,
                        "-d", str(ROOT / folder), requirement], check=True)
        name, version = requirement.split("==")
        path = next((ROOT / folder).glob(f"{name}-{version}-*.whl"))
        files[path.name] = {"folder": folder, "size": path.stat().st_size, "sha256": sha256(path)}
    fetch_sdist(ROOT / KIT / "small")
    sdist = ROOT / KIT / "small" / SDIST
    files[SDIST] = {"folder": f"{KIT}/small", "size": sdist.stat().st_size, "sha256": sha256(sdist)}
    room = room_per_call()
    part_bytes = part_bytes or max(MIB, (room - GROWTH) // MIB * MIB)
    for name, entry in files.items():
        if entry["folder"] == f"{KIT}/big":
            entry["parts"] = split(ROOT / KIT / "big" / name, ROOT / KIT / "parts", part_bytes)
            (ROOT / KIT / "big" / name).unlink()  # the parts hold it; the device machine rebuilds it
    manifest = {"te_version": TE_VERSION, "part_bytes": part_bytes, "files": files}
    manifest["transfers"] = transfers(manifest, room)
    MANIFEST.write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> int:
    """download | plan | check [--partial] | join."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=("download", "plan", "check", "join"))
    parser.add_argument("--kit", default=os.environ.get("GPU_TE_KIT", str(ROOT / KIT)),
                        help="the kit folder (default: $GPU_TE_KIT, else .gpu_te in the checkout)")
    parser.add_argument("--manifest", default=os.environ.get("GPU_TE_MANIFEST", str(MANIFEST)))
    parser.add_argument("--part-mib", type=int, default=None,
                        help="part size (default: what one call can carry beside the checkout, less GROWTH)")
    parser.add_argument("--partial", action="store_true", help="check: the files present only")
    parser.add_argument("--data", default=os.environ.get("GPU_DATA", str(ROOT / DATA)),
                        help=f"plan: the battery's data folder, carried with the last call (default: {DATA})")
    args = parser.parse_args(argv)
    try:
        if args.action == "download":
            manifest = download(args.part_mib * MIB if args.part_mib else None)
            print(f"{len(manifest['files'])} files, {len(manifest['transfers'])} device calls: {MANIFEST}")
            return 0
        manifest_path = Path(args.manifest)
        if not manifest_path.is_file():
            raise KitError(f"{manifest_path} is missing: run `python benchmarks/gpu_te/kit.py download` here first")
        manifest = json.loads(manifest_path.read_text())
        kit = Path(args.kit)
        if args.action == "plan":
            calls = device_calls(manifest, Path(args.data))
            for index, paths in enumerate(calls, 1):
                last = index == len(calls)
                print(f"call {index}: carry {json.dumps(paths)}; command: "
                      + (DEVICE_COMMAND if last
                         else "python3 benchmarks/gpu_te/kit.py check --partial"))
            return 0
        if args.action == "check":
            present, expected = check(manifest, kit, args.partial)
            print(f"kit: {present} of {expected} files and parts here, each with the manifest's sha256")
            return 0
        rebuilt = join(manifest, kit)
        check(manifest, kit, partial=False)
        print(f"kit: every part and file checked; rebuilt {', '.join(p.name for p in rebuilt)}")
        return 0
    except KitError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
