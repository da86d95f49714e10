"""Which tests run Megatron-Core code: the rule that picks what the newest megatron-core phase runs.

The pinned phase records, per test, whether any process of it (the pytest worker, a process forked from the
zygote, a process exec'ed from the test and what that starts in turn, a SLURM job it submits) can have run
Megatron-Core code; `make test-newest-megatron` then runs only the recorded tests (`--megatron-record FILE`), since
the rest run the same code whatever Megatron-Core is installed. The record is kept in a file beside the phase log.

What a record line names (UNIT_ENV, set by tests/conftest.py around each step): a test id (its setup, call and
teardown); a test module (the import of the module at collection: every test of it); or `fixture:NAME` (the setup
of a module- or session-scoped fixture: every test that uses a fixture of that name, since its product is shared
by tests that never import Megatron themselves).

Why an executed import statement is the signal: our code imports Megatron-Core inside the functions that call it
(only the modules of MEGATRON_AT_IMPORT import it when they are imported), and a call into Megatron-Core starts
from code reached through an executed import: of megatron itself, of a module of MEGATRON_AT_IMPORT, or a REACHES
lookup (which imports its owner module with importlib). `import` and `importlib.import_module` are wrapped, so a
statement counts each time it runs, cached or not; a zygote-forked process inherits the wrappers.

Every interpreter of this environment is watched, through a .pth file in its site-packages (SITE_HOOK; the
project's other venvs add this site-packages, so its .pth files run there too): started with a test's recording
environment, it records for that test, and so does everything it starts in turn with that environment (a launcher's
`python -m pretrain` under bash, a SLURM job, torchrun's ranks). Started without that environment (a script that
strips it, `env -i`, `sbatch --export=NONE`) while a recording run is live (a LIVE_PREFIX file beside the .pth), it
records as UNATTRIBUTED (into the nearest live run it descends from, else into every live run a test did not
start), and a record holding that line makes the newest phase run every test: fail closed (a test that gives its
process an environment of its own adds `environment()` to it). So an exec of another program (bash, sbatch,
torchrun) is no Megatron use by itself; an exec that cannot be watched counts at once: another interpreter, or this
one with -S (no site-packages, so no .pth). What escapes: an interpreter without this site-packages started by a
program a test runs (none of the project's scripts does).
tests/test_megatron_record.py checks the rule.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import os
import sys
import sysconfig
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECORD_ENV = "POSAUG_MEGATRON_RECORD"  # the record file (set by the pinned phase)
UNIT_ENV = "POSAUG_TEST_UNIT"  # what runs now: a test id, a test module or fixture:NAME (tests/conftest.py sets it)
WATCHED_ENV = "POSAUG_MEGATRON_WATCHED"  # megatron_at_import(), computed once (0.24 CPU-s) for every process
UNATTRIBUTED = "unattributed"  # a process started without the recording environment: the newest phase runs all
SITE_HOOK = "zz_posaug_megatron_record.pth"
LIVE_PREFIX = "zz_posaug_megatron_record.live."  # + the pid of a recording pytest run; holds its record file's path
_SITE = Path(sysconfig.get_paths()["purelib"])
# One line (a .pth runs lines that start with `import`), inert unless a test's recording environment is set or,
# without it, a recording run is live: then it loads this file, which installs the wrappers.
_SITE_HOOK_LINE = (f"import os, importlib.util as u; r = os.environ.get('{RECORD_ENV}'); s = ((r and "
                   f"os.environ.get('{UNIT_ENV}')) or (not r and any(n.startswith('{LIVE_PREFIX}') for n in "
                   f"os.listdir({str(_SITE)!r})))) and u.spec_from_file_location('posaug_megatron_record', "
                   f"{str(Path(__file__).resolve())!r}); s and s.loader.exec_module(u.module_from_spec(s))\n")
_seen: set[tuple[str, int]] = set()


def megatron_at_import() -> frozenset[str]:
    """Our modules whose import imports megatron (module-level imports, followed through our modules)."""
    modules = {}
    for package in ("pretrain", "megatron_ext", "data_prep"):
        for path in (REPO / package).rglob("*.py"):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    edges, found = {}, set()
    for name, path in modules.items():
        targets: set[str] = set()
        for node in _module_level_imports(ast.parse(path.read_text()).body):
            package = name if path.name == "__init__.py" else name.rpartition(".")[0]
            for imported in _names(node, package):
                if imported.split(".")[0] == "megatron":
                    found.add(name)
                targets |= {imported[:i] for i in range(len(imported) + 1) if imported[i:i + 1] in ("", ".")
                            and imported[:i] in modules}
        edges[name] = targets
    changed = True
    while changed:
        changed = False
        for name, targets in edges.items():
            if name not in found and targets & found:
                found.add(name)
                changed = True
    return frozenset(found)


def _module_level_imports(body):
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            for block in (node.body, getattr(node, "orelse", []), getattr(node, "finalbody", [])):
                yield from _module_level_imports(block)
            for handler in getattr(node, "handlers", []):
                yield from _module_level_imports(handler.body)


def _names(node, package: str) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        parts = package.split(".")
        base = ".".join(parts[: len(parts) - (node.level - 1)] + ([node.module] if node.module else []))
    return [base] + [f"{base}.{alias.name}" for alias in node.names]


def _live_records() -> list[str]:
    """The record of the nearest recording run this process descends from, else of every live run not started by a
    test (a SLURM job's process descends from slurmd, not from a test; a run a test starts has its own processes)."""
    live, outermost = {}, []
    for mark in _SITE.glob(f"{LIVE_PREFIX}*"):
        try:
            pid = int(mark.name[len(LIVE_PREFIX):])
            os.kill(pid, 0)  # a killed run leaves its mark
            path, _, started_by = mark.read_text().strip().partition("\n")
        except (ValueError, OSError):
            continue
        live[pid] = path
        if started_by != "test":
            outermost.append(path)
    pid = os.getpid()
    while pid > 1:
        if pid in live:
            return [live[pid]]
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            pid = int(stat[stat.rindex(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return outermost


def record(reason: str) -> None:
    """Note that the running test (or module, or shared fixture) used or may have used Megatron-Core."""
    if os.environ.get(RECORD_ENV):
        paths, unit = [os.environ[RECORD_ENV]], os.environ.get(UNIT_ENV)
        if not unit:  # between tests: a zygote server's own imports, pytest's start-up
            return
    else:
        paths, unit = _live_records(), UNATTRIBUTED
        reason = f"{reason} by {' '.join(sys.orig_argv)[:200]}"
    if (unit, os.getpid()) in _seen:
        return
    _seen.add((unit, os.getpid()))
    for path in paths:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            # where it ran, a third column: a few Megatron-free tests are recorded in one run and not the next
            # (docs/testing.md), and the pid and thread say by what
            os.write(fd, f"{unit}\t{reason}\tpid {os.getpid()} thread {threading.current_thread().name}\n".encode())
        finally:
            os.close(fd)


def install() -> None:
    """Wrap `import` and importlib.import_module in this process (and the processes forked from it)."""
    if getattr(builtins.__import__, "_megatron_record", False):
        return
    watched = frozenset(os.environ[WATCHED_ENV].split(",")) if WATCHED_ENV in os.environ else megatron_at_import()
    original_import, original_import_module = builtins.__import__, importlib.import_module

    def megatron_name(name: str) -> bool:
        return name == "megatron" or name.startswith("megatron.") or name in watched

    def recording_import(name, globals=None, locals=None, fromlist=(), level=0):
        if level and globals:  # our own relative imports of a watched module
            package = globals.get("__package__") or ""
            parts = package.split(".")
            name_ = ".".join(parts[: len(parts) - (level - 1)] + ([name] if name else []))
        else:
            name_ = name
        if megatron_name(name_) or any(megatron_name(f"{name_}.{item}") for item in fromlist or ()):
            record(f"import {name_}")
        return original_import(name, globals, locals, fromlist, level)

    def recording_import_module(name, package=None):
        if not name.startswith(".") and megatron_name(name):
            record(f"importlib {name}")
        return original_import_module(name, package)

    recording_import._megatron_record = True
    builtins.__import__ = recording_import
    importlib.import_module = recording_import_module


def install_site_hook() -> None:
    """Watch every interpreter of this environment (SITE_HOOK), from now on, for the run whose record is set.

    The file stays (inert without a recording environment or a live run): a pytest run inside a test would
    otherwise remove it from under the run around it.
    """
    path = _SITE / SITE_HOOK
    if not path.is_file() or path.read_text() != _SITE_HOOK_LINE:  # atomically: interpreters may be starting
        part = path.with_name(f".{SITE_HOOK}.{os.getpid()}")
        part.write_text(_SITE_HOOK_LINE)
        os.replace(part, path)
    os.environ[WATCHED_ENV] = ",".join(sorted(megatron_at_import()))


def mark_live() -> Path:
    """Declare this run live: interpreters started without its environment record as UNATTRIBUTED into it."""
    live = _SITE / f"{LIVE_PREFIX}{os.getpid()}"
    started_by = "test" if UNIT_ENV in os.environ else "top"  # a pytest run inside a test (tests/conftest.py)
    live.write_text(f"{Path(os.environ[RECORD_ENV]).resolve()}\n{started_by}\n")
    return live


def environment() -> dict[str, str]:
    """The recording environment of this process, for a test that starts a process with an environment of its own."""
    return {name: os.environ[name] for name in (RECORD_ENV, UNIT_ENV, WATCHED_ENV) if name in os.environ}


def exec_counts(args, env=None) -> bool:
    """Whether an exec'ed process counts as Megatron use at once: an interpreter SITE_HOOK cannot watch."""
    argv = [args] if isinstance(args, (str, bytes)) else list(args)
    if not argv:
        return False
    words = os.fsdecode(argv[0]).split() if isinstance(args, (str, bytes)) else [os.fsdecode(a) for a in argv]
    if not words or not os.path.basename(words[0]).startswith("python"):
        return False  # not Python: what it starts is watched (module docstring)
    if words[0] != sys.executable:
        return True
    for arg in words[1:]:
        if not arg.startswith("-") or arg in ("-m", "-c"):
            break
        if not arg.startswith("--") and "S" in arg:  # -S: no site-packages, so no hook
            return True
    return False


def recorded_units(path: Path) -> set[str]:
    """What a record names: test ids, test modules, fixture:NAME and UNATTRIBUTED."""
    return {line.split("\t")[0] for line in path.read_text().splitlines() if line.strip()}


def selected(nodeid: str, fixturenames, units: set[str]) -> bool:
    """Whether the newest phase runs this test: it, its module or a shared fixture it uses is recorded."""
    return (nodeid in units or nodeid.split("::")[0] in units
            or any(f"fixture:{name}" in units for name in fixturenames))


if __name__ == "posaug_megatron_record":  # loaded by SITE_HOOK in an exec'ed interpreter
    if not os.environ.get(RECORD_ENV) and WATCHED_ENV not in os.environ:
        os.environ[WATCHED_ENV] = ",".join(sorted(megatron_at_import()))
    install()
