"""The Transformer Engine carry kit (benchmarks/gpu_te/kit.py, device.sh), on a small fake payload: split, join,
checksums, the device command's size, and the refusal of a missing or corrupt part."""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks" / "gpu_te"))

import kit  # noqa: E402

BIG = "fake_cu13-1.0-py3-none-any.whl"


@pytest.fixture
def fake_kit(tmp_path):
    """A checkout-like folder with a split 'large wheel', a small wheel, a .whl/ wheel, and its manifest."""
    payload = os.urandom(10_000 + 7)
    (tmp_path / ".gpu_te" / "big").mkdir(parents=True)
    (tmp_path / ".gpu_te" / "small").mkdir()
    (tmp_path / ".whl").mkdir()
    big = tmp_path / ".gpu_te" / "big" / BIG
    big.write_bytes(payload)
    files = {BIG: {"folder": ".gpu_te/big", "size": len(payload), "sha256": kit.sha256(big),
                   "parts": kit.split(big, tmp_path / ".gpu_te" / "parts", 4096)}}
    big.unlink()
    for folder, name in ((".gpu_te/small", "small-1.0-py3-none-any.whl"), (".whl", "mcore-0.16.1-cp312.whl")):
        path = tmp_path / folder / name
        path.write_bytes(name.encode() * 10)
        files[name] = {"folder": folder, "size": path.stat().st_size, "sha256": kit.sha256(path)}
    manifest = {"files": files, "part_bytes": 4096}
    manifest["transfers"] = kit.transfers(manifest, room=8192)
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    return tmp_path, payload


def run_kit(root: Path, *args: str) -> subprocess.CompletedProcess:
    """kit.py as the device command runs it, on the fake kit."""
    return subprocess.run([sys.executable, str(REPO / "benchmarks/gpu_te/kit.py"), *args, "--kit",
                           str(root / ".gpu_te"), "--manifest", str(root / "manifest.json")],
                          capture_output=True, text=True)


def test_split_cuts_a_file_into_parts_no_larger_than_asked_with_their_sha256(fake_kit):
    root, payload = fake_kit
    parts = json.loads((root / "manifest.json").read_text())["files"][BIG]["parts"]
    assert [p["size"] for p in parts] == [4096, 4096, len(payload) - 8192]
    for part in parts:
        assert hashlib.sha256((root / ".gpu_te/parts" / part["name"]).read_bytes()).hexdigest() == part["sha256"]


def test_join_rebuilds_the_file_byte_for_byte(fake_kit):
    root, payload = fake_kit
    result = run_kit(root, "join")
    assert result.returncode == 0, result.stderr
    assert (root / ".gpu_te/whole" / BIG).read_bytes() == payload


def test_a_missing_part_is_refused_in_one_line_with_exit_2(fake_kit):
    root, _ = fake_kit
    (root / ".gpu_te/parts" / f"{BIG}.part01").unlink()
    result = run_kit(root, "join")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "part01 is missing" in result.stderr


def test_a_corrupt_part_of_the_right_size_is_refused(fake_kit):
    root, _ = fake_kit
    part = root / ".gpu_te/parts" / f"{BIG}.part02"
    data = bytearray(part.read_bytes())
    data[5] ^= 1
    part.write_bytes(bytes(data))
    result = run_kit(root, "join")
    assert result.returncode == 2 and "part02 has another sha256" in result.stderr
    assert not (root / ".gpu_te/whole" / BIG).exists()


def test_a_corrupt_small_wheel_is_refused(fake_kit):
    root, _ = fake_kit
    (root / ".whl/mcore-0.16.1-cp312.whl").write_bytes(b"x")
    result = run_kit(root, "join")
    assert result.returncode == 2 and "mcore-0.16.1-cp312.whl has 1 bytes" in result.stderr


def test_partial_check_counts_what_arrived_and_refuses_only_what_is_damaged(fake_kit):
    root, _ = fake_kit
    (root / ".gpu_te/parts" / f"{BIG}.part00").unlink()
    result = run_kit(root, "check", "--partial")
    assert result.returncode == 0 and "4 of 5 files and parts" in result.stdout
    assert run_kit(root, "check").returncode == 2


def test_device_script_refuses_a_missing_part_before_installing_anything(fake_kit, tmp_path):
    root, _ = fake_kit
    (root / ".gpu_te/parts" / f"{BIG}.part00").unlink()
    env = {**os.environ, "GPU_TE_KIT": str(root / ".gpu_te"), "GPU_TE_MANIFEST": str(root / "manifest.json"),
           "OUT": str(tmp_path / "out")}
    result = subprocess.run(["bash", "benchmarks/gpu_te/device.sh"], cwd=REPO, env=env, capture_output=True,
                            text=True)
    assert result.returncode == 2 and "part00 is missing" in result.stderr
    assert not (root / ".gpu_te/site").exists()


def test_every_call_fits_the_device_limit_and_the_small_files_ride_with_a_part(fake_kit):
    root, _ = fake_kit
    calls = json.loads((root / "manifest.json").read_text())["transfers"]
    assert len(calls) == 3
    assert calls[-1][1:] == [".gpu_te/small", ".whl"]


def test_the_shipped_manifest_plans_calls_within_64_mib_with_the_checkout():
    manifest = json.loads(kit.MANIFEST.read_text())
    sizes = kit.carried_sizes(manifest)
    carried = [path for paths in manifest["transfers"] for path in paths]
    assert sorted(carried) == sorted(sizes)  # every part and folder travels, once
    for paths in manifest["transfers"]:
        assert sum(sizes[path] for path in paths) <= kit.room_per_call() + kit.MARGIN


def test_the_device_command_is_within_the_tools_2000_characters():
    assert len(kit.DEVICE_COMMAND) <= 2000
    assert len("python3 benchmarks/gpu_te/kit.py check --partial") <= 2000


def test_the_plans_last_call_carries_the_batterys_data_and_passes_its_prefix(fake_kit):
    root, _ = fake_kit
    (root / ".gpu_data/data/shards").mkdir(parents=True)
    (root / ".gpu_data/data/shards/corpus_train.bin").write_bytes(b"\0" * 1024)
    result = run_kit(root, "plan", "--data", str(root / ".gpu_data"))
    assert result.returncode == 0, result.stderr
    last = result.stdout.splitlines()[-1]
    assert '".whl", ".gpu_data"]' in last and last.endswith("--data-prefix .gpu_data/data/shards/corpus")


def test_a_plan_without_the_batterys_data_is_refused_naming_the_command_that_builds_it(fake_kit):
    root, _ = fake_kit
    result = run_kit(root, "plan", "--data", str(root / ".gpu_data"))
    assert result.returncode == 2 and result.stdout == "" and result.stderr.count("\n") == 1
    assert "python benchmarks/gpu_lease.py --prepare-data --output .gpu_data" in result.stderr


def _declare_last_call_bytes(root: Path, total: int) -> None:
    """Rewrite the fake manifest so that its last call declares `total` bytes (its .whl entry takes the rest)."""
    manifest = json.loads((root / "manifest.json").read_text())
    others = manifest["files"][BIG]["parts"][-1]["size"] + sum(
        e["size"] for e in manifest["files"].values() if e["folder"] == ".gpu_te/small")
    [whl] = [name for name, e in manifest["files"].items() if e["folder"] == ".whl"]
    manifest["files"][whl]["size"] = total - others
    (root / "manifest.json").write_text(json.dumps(manifest))


def test_the_data_travels_in_its_own_call_before_the_last_when_the_last_is_full(fake_kit):
    root, _ = fake_kit
    (root / ".gpu_data/data/shards").mkdir(parents=True)
    (root / ".gpu_data/data/shards/corpus_train.bin").write_bytes(b"\0" * 1024)
    _declare_last_call_bytes(root, kit.room_per_call() - 100)
    result = run_kit(root, "plan", "--data", str(root / ".gpu_data"))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 4 and lines[2].startswith('call 3: carry [".gpu_data"]; command: python3')
    assert '".whl"]; command: bash benchmarks/gpu_te/device.sh' in lines[3]


def test_a_plan_with_a_call_larger_than_the_room_beside_the_checkout_is_refused_naming_the_fix(fake_kit):
    root, _ = fake_kit
    (root / ".gpu_data/data/shards").mkdir(parents=True)
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["files"][BIG]["parts"][0]["size"] = kit.room_per_call() + 1  # the checkout grew since the parts were cut
    (root / "manifest.json").write_text(json.dumps(manifest))
    result = run_kit(root, "plan", "--data", str(root / ".gpu_data"))
    assert result.returncode == 2 and result.stdout == "" and result.stderr.count("\n") == 1
    assert "device call 1 would carry" in result.stderr and "kit.py download --part-mib" in result.stderr
