"""The version contract: ranges in setup.cfg, exact pins only in constraints-cpu.txt, every tested megatron-core named
in one place (megatron_ext/versions.py), private reaches found by name (also in a source tree without pip metadata)
and nothing our code imports that Python 3.12 / 3.13 removed."""

from __future__ import annotations

import ast
import configparser
import os
import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from conftest import REPO
from megatron_ext.versions import MEGATRON_CORE_REQUIREMENT, REACHES, TESTED_MEGATRON_CORE, Reach, find, \
    in_tested_range, log_missing_reaches, megatron_core_version, missing_line

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
    """A `NAME := value` of the Makefile, its backslash-continued lines joined."""
    text = (REPO / "Makefile").read_text().replace("\\\n", " ")
    return " ".join(re.search(rf"^{name} := (.+)$", text, re.M).group(1).split())


@pytest.mark.parametrize("package", ["torch", "megatron-core"])
def test_requirements_hold_no_exact_pin(package):
    requirement = _install_requires()[package]
    assert requirement.specifier and all(spec.operator in (">=", "<") for spec in requirement.specifier), requirement


def test_torch_floor_is_megatron_cores_own():
    assert str(_install_requires()["torch"].specifier) == ">=2.6"


def test_megatron_core_requirement_is_the_tested_range():
    assert _install_requires()["megatron-core"].specifier == Requirement(
        f"megatron-core{MEGATRON_CORE_REQUIREMENT}").specifier


def test_every_tested_version_lies_in_the_range_and_the_next_minor_does_not():
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


def test_makefile_matrix_holds_every_tested_megatron_core_but_the_pinned_one():
    assert _makefile_variable("MCORE_MATRIX").split() == list(TESTED_MEGATRON_CORE[1:])
    assert _makefile_variable("MCORE_NEWEST") == TESTED_MEGATRON_CORE[-1]


def test_the_newest_minor_runs_the_tests_the_pinned_phase_recorded_as_using_megatron():
    makefile = (REPO / "Makefile").read_text()
    record = _makefile_variable("MEGATRON_RECORD")
    assert f"POSAUG_MEGATRON_RECORD=$(CURDIR)/$(MEGATRON_RECORD)" in makefile  # the pinned phase writes it
    # with "=": pytest takes a bare value after an option it does not know yet for a path, and misses the conftest
    assert makefile.count("--megatron-record=$(MEGATRON_RECORD)") == 1 and record.endswith(".tsv")
    assert '--megatron-slow="$(NEWEST_CHECKPOINT_TESTS)" tests' in makefile


def test_every_tested_minor_is_a_different_minor():
    minors = [Version(version).release[:2] for version in TESTED_MEGATRON_CORE]
    assert len(set(minors)) == len(minors) and minors == sorted(minors)


def test_every_reach_is_found_in_the_installed_megatron_core():
    assert {name: find(name) is not None for name in REACHES} == {name: True for name in REACHES}


def test_a_reach_falls_back_to_its_next_candidate_in_order(monkeypatch):
    monkeypatch.setitem(REACHES, "probe", Reach("probe", "megatron.core.transformer.utils",
                                                ("renamed_in_a_future_release", "get_default_causal_mask"),
                                                "megatron_ext.cpu_compat", "a probe"))
    assert find("probe")[0] == "get_default_causal_mask"


def test_a_reach_megatron_lacks_is_one_line_naming_it_and_the_module_using_it(monkeypatch, caplog):
    monkeypatch.setitem(REACHES, "probe", Reach("probe", "megatron.core.transformer.utils", ("gone", "gone_too"),
                                                "megatron_ext.cpu_compat", "a probe"))
    lines = log_missing_reaches()
    assert lines == [missing_line("probe")] and "\n" not in lines[0]
    assert "megatron.core.transformer.utils.{gone | gone_too}" in lines[0] and "megatron_ext.cpu_compat" in lines[0]
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == lines


def _site_without_megatron(tmp_path):
    """A copy of the installed megatron tree (no dist-info) and a site dir linking everything else installed."""
    import importlib.util
    import shutil

    tree = Path(importlib.util.find_spec("megatron").submodule_search_locations[0])
    source, site = tmp_path / "Megatron-LM", tmp_path / "site"
    shutil.copytree(tree, source / "megatron", ignore=shutil.ignore_patterns("__pycache__"))
    site.mkdir()
    installed = Path(importlib.util.find_spec("torch").origin).parents[1]
    for entry in installed.iterdir():
        if entry.name != "megatron" and not entry.name.startswith("megatron_core") and entry.suffix != ".pth":
            (site / entry.name).symlink_to(entry)
    return source, site


BRANCH_TAKEN = """
import importlib.metadata, json, sys
import megatron_ext.cpu_compat
megatron_ext.cpu_compat.apply()
from megatron.core.dist_checkpointing.strategies import filesystem_async
from megatron_ext import versions
from pretrain.trainer import children
try:
    importlib.metadata.version("megatron-core")
    metadata = "visible"
except importlib.metadata.PackageNotFoundError:
    metadata = "absent"
children.start_checkpoint_helpers()
print(json.dumps({"metadata": metadata, "file": filesystem_async.__file__, "version": str(versions.megatron_core_version()),
                  "found": {name: (versions.find(name) or [None])[0] for name in versions.REACHES},
                  "queue_started": filesystem_async._results_queue is not None}))
"""


@pytest.mark.slow  # copies the megatron tree and imports it in a subprocess (~20 s)
def test_megatron_source_tree_without_pip_metadata_takes_the_branch_its_code_has(tmp_path):
    import json
    import subprocess
    import sys

    from megatron.core.dist_checkpointing.strategies import filesystem_async

    source, site = _site_without_megatron(tmp_path)
    env = {"PYTHONPATH": os.pathsep.join([str(source), str(REPO), str(site)]), "OMP_NUM_THREADS": "1",
           "CUDA_VISIBLE_DEVICES": "", "PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-S", "-c", BRANCH_TAKEN], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.splitlines()[-1])
    assert seen["metadata"] == "absent" and seen["file"].startswith(str(source)), seen
    assert seen["version"] == str(megatron_core_version())
    expected = "get_write_results_queue" if hasattr(filesystem_async, "get_write_results_queue") \
        else "_get_write_results_queue"
    assert seen["found"]["write_results_queue"] == expected and seen["queue_started"], seen
    assert all(seen["found"][name] for name in REACHES), seen["found"]


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
