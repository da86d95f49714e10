"""Which test modules run Megatron-Core code: the rule that picks what the newest megatron-core phase runs.

The pinned phase records, per test module, whether any process of its tests (the pytest worker during collection
and tests, a process forked from the zygote, a process exec'ed from the test) can have run Megatron-Core code;
`make test-newest-megatron` then runs only the recorded modules (`--megatron-modules FILE`), since the rest run the
same code whatever Megatron-Core is installed. The record is kept in a file beside the phase log.

Why an executed import statement is the signal: our code imports Megatron-Core inside the functions that call it
(only the modules of MEGATRON_AT_IMPORT import it when they are imported), and a call into Megatron-Core starts
from code reached through an executed import: of megatron itself, of a module of MEGATRON_AT_IMPORT, or a REACHES
lookup (which imports its owner module with importlib). `import` and `importlib.import_module` are wrapped, so a
statement counts each time it runs, cached or not; a zygote-forked process inherits the wrappers. This
interpreter exec'ed from a test with the test's recording environment installs them too, through a .pth file in
its site-packages (SITE_HOOK, inert without that environment), and so does every process it starts in turn with
that environment (a launcher's `python -m pretrain`, a SLURM job, torchrun's ranks). Any other process exec'ed from
a test (torchrun, sbatch, bash, another interpreter, this one with -S or without the environment) cannot be watched,
so it counts as Megatron use, unless it is one of SYSTEM_TOOLS. tests/test_megatron_record.py checks that a module
calling a reach is recorded.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import os
import sys
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECORD_ENV = "POSAUG_MEGATRON_RECORD"  # the record file (set by the pinned phase)
MODULE_ENV = "POSAUG_TEST_MODULE"  # the test module running now (set around collection and each test)
HOOK_ENV = "POSAUG_MEGATRON_RECORD_HOOK"  # this file, for SITE_HOOK to load in an exec'ed interpreter
WATCHED_ENV = "POSAUG_MEGATRON_WATCHED"  # megatron_at_import(), computed once (0.24 CPU-s) for every process
SITE_HOOK = "zz_posaug_megatron_record.pth"
# One line (a .pth runs lines that start with `import`); it does nothing unless a test's recording environment is set.
_SITE_HOOK_LINE = (f"import os, importlib.util as u; p = os.environ.get('{HOOK_ENV}'); s = p and "
                   f"os.environ.get('{RECORD_ENV}') and os.environ.get('{MODULE_ENV}') and "
                   "u.spec_from_file_location('posaug_megatron_record', p); "
                   "s and s.loader.exec_module(u.module_from_spec(s))\n")
SYSTEM_TOOLS = frozenset({"mount", "umount", "git", "df", "dpkg", "id", "sync", "true", "false", "ls", "cat"})
_seen: set[str] = set()


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


def record(reason: str) -> None:
    """Note that the running test module used (or may have used) Megatron-Core."""
    path, module = os.environ.get(RECORD_ENV), os.environ.get(MODULE_ENV)
    if not path or not module or (module, os.getpid()) in _seen:
        return
    _seen.add((module, os.getpid()))
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{module}\t{reason}\n".encode())
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
    """Make exec'ed interpreters of this environment record for their test (SITE_HOOK), from now on.

    The file stays (inert without the recording environment): a pytest run inside a test would otherwise remove
    it from under the run around it.
    """
    path = Path(sysconfig.get_paths()["purelib"]) / SITE_HOOK
    if not path.is_file() or path.read_text() != _SITE_HOOK_LINE:  # atomically: interpreters may be starting
        part = path.with_name(f".{SITE_HOOK}.{os.getpid()}")
        part.write_text(_SITE_HOOK_LINE)
        os.replace(part, path)
    os.environ[HOOK_ENV] = str(Path(__file__).resolve())
    os.environ[WATCHED_ENV] = ",".join(sorted(megatron_at_import()))


def _watched(args: list[str], env) -> bool:
    """An exec of this interpreter that SITE_HOOK makes record for the same test module."""
    env = os.environ if env is None else {os.fsdecode(k): os.fsdecode(v) for k, v in env.items()}
    if not args or os.fsdecode(args[0]) != sys.executable:
        return False
    for arg in map(os.fsdecode, args[1:]):
        if not arg.startswith("-") or arg in ("-m", "-c"):
            break
        if not arg.startswith("--") and "S" in arg:  # -S: no site-packages, so no hook
            return False
    return all(env.get(k) == os.environ.get(k) and env.get(k) for k in (RECORD_ENV, MODULE_ENV, HOOK_ENV, WATCHED_ENV))


def exec_counts(args, env=None) -> bool:
    """Whether an exec'ed process counts as Megatron use: anything but SYSTEM_TOOLS and interpreters that record."""
    if not isinstance(args, (str, bytes)) and _watched(list(args), env):
        return False
    first = args if isinstance(args, (str, bytes)) else (args[0] if args else "")
    return os.path.basename(os.fsdecode(first).split()[0] if first else "") not in SYSTEM_TOOLS


def recorded_modules(path: Path) -> set[str]:
    """The test modules a record names."""
    return {line.split("\t")[0] for line in path.read_text().splitlines() if line.strip()}


if __name__ == "posaug_megatron_record":  # loaded by SITE_HOOK in an exec'ed interpreter
    install()
