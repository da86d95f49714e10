"""The version contract: ranges in setup.cfg, exact pins only in constraints-cpu.txt, both megatron-core ends named
in one place (megatron_ext/versions.py) and nothing our code imports that Python 3.12 / 3.13 removed."""

from __future__ import annotations

import ast
import configparser
import re

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from conftest import REPO
from megatron_ext.versions import MEGATRON_CORE_REQUIREMENT, TESTED_MEGATRON_CORE, in_tested_range, \
    megatron_core_version

# Standard-library modules removed in Python 3.12 (PEP 594's first wave, distutils, imp) and 3.13.
REMOVED_IN_312_313 = {"distutils", "imp", "asynchat", "asyncore", "smtpd", "aifc", "audioop", "cgi", "cgitb",
                      "chunk", "crypt", "imghdr", "mailcap", "msilib", "nis", "nntplib", "ossaudiodev", "pipes",
                      "sndhdr", "spwd", "sunau", "telnetlib", "uu", "xdrlib", "lib2to3"}


def _install_requires() -> dict[str, Requirement]:
    parser = configparser.ConfigParser()
    parser.read(REPO / "setup.cfg")
    lines = [line.strip() for line in parser["options"]["install_requires"].splitlines() if line.strip()]
    return {Requirement(line).name: Requirement(line) for line in lines}


def _constraints() -> dict[str, str]:
    pins = {}
    for line in (REPO / "constraints-cpu.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[name.strip()] = version.strip()
    return pins


def _makefile_variable(name: str) -> str:
    return re.search(rf"^{name} := (\S+)$", (REPO / "Makefile").read_text(), re.M).group(1)


@pytest.mark.parametrize("package", ["torch", "megatron-core"])
def test_requirements_hold_no_exact_pin(package):
    requirement = _install_requires()[package]
    assert requirement.specifier and all(spec.operator in (">=", "<") for spec in requirement.specifier), requirement


def test_torch_floor_is_megatron_cores_own():
    assert str(_install_requires()["torch"].specifier) == ">=2.6"


def test_megatron_core_requirement_is_the_tested_range():
    assert _install_requires()["megatron-core"].specifier == Requirement(
        f"megatron-core{MEGATRON_CORE_REQUIREMENT}").specifier


def test_both_tested_ends_lie_in_the_range_and_the_next_minor_does_not():
    assert all(in_tested_range(Version(version)) for version in TESTED_MEGATRON_CORE)
    assert not in_tested_range(Version("0.20.0")) and not in_tested_range(Version("0.15.0"))


def test_container_torch_prerelease_with_local_version_is_kept_by_pip():
    # pip accepts an installed pre-release when the specifier contains it with prereleases=True (its rule for
    # installed distributions), so an NGC image's torch is not replaced by PyPI's.
    specifier = _install_requires()["torch"].specifier
    for container_torch in ("2.9.0a0+145a3a7bda.nv25.10", "2.8.0a0+5228986c39.nv25.06", "2.13.0+cpu"):
        assert specifier.contains(container_torch, prereleases=True), container_torch


def test_constraints_pin_what_this_machine_installs():
    assert _constraints() == {"torch": "2.13.0", "megatron-core": TESTED_MEGATRON_CORE[0]}


def test_makefile_applies_the_constraints_to_every_install_of_the_main_environment():
    makefile = (REPO / "Makefile").read_text()
    assert _makefile_variable("CONSTRAINTS") == "constraints-cpu.txt"
    main_installs = [line for line in makefile.splitlines() if line.strip().startswith("$(BIN)/pip install")
                     and "--upgrade pip" not in line]
    assert main_installs and all("-c $(CONSTRAINTS)" in line for line in main_installs), main_installs


def test_makefile_second_environment_is_the_newest_tested_megatron_core():
    assert _makefile_variable("MCORE_NEWEST") == TESTED_MEGATRON_CORE[-1]


def test_suite_runs_on_a_tested_megatron_core():
    assert str(megatron_core_version()) in TESTED_MEGATRON_CORE


def test_no_module_imports_what_python_312_or_313_removed():
    found = []
    for package in ("pretrain", "megatron_ext", "data_prep", "tests", "benchmarks"):
        for path in sorted((REPO / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
                found += [f"{path.relative_to(REPO)}: {name}" for name in names
                          if name.split(".")[0] in REMOVED_IN_312_313]
    assert not found


@pytest.mark.slow  # a venv and a real pip resolve (~1 min)
def test_pip_install_into_a_container_keeps_its_prerelease_torch(tmp_path):
    import subprocess
    import sys

    venv = tmp_path / "container"
    subprocess.run([sys.executable, "-m", "venv", venv], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    site = subprocess.run([python, "-c", "import site; print(site.getsitepackages()[0])"], check=True,
                          capture_output=True, text=True).stdout.strip()
    # What an NGC PyTorch image's torch looks like to pip: an installed distribution with a local pre-release version.
    dist_info = tmp_path / site / "torch-2.9.0a0+145a3a7bda.nv25.10.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.9.0a0+145a3a7bda.nv25.10\n")
    (dist_info / "RECORD").write_text("")
    proc = subprocess.run([python, "-m", "pip", "install", "--dry-run", "-e", str(REPO)],
                          capture_output=True, text=True, timeout=600)
    would_install = [line for line in proc.stdout.splitlines() if line.startswith("Would install")]
    assert proc.returncode == 0 and would_install, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "torch-" not in would_install[0] and " megatron-core-" in would_install[0], would_install[0]
