"""Protections broken on purpose: each entry of TABLE removes one protection in a scratch copy of the working tree
and runs the tests that must then fail.

    .venv/bin/python tests/protections.py --list          # the table as markdown
    .venv/bin/python tests/protections.py [NAME ...]      # break each entry (or the named ones) and run its tests
    .venv/bin/python tests/protections.py --baseline ...  # first run the same tests without the break

Outcomes: CAUGHT (the tests failed with the break in place), MISSED (they passed: the protection is not tested),
STALE (the entry's find string does not occur exactly once: the code moved, and the entry must follow it), ERROR
(no verdict: pytest could not run the tests, they timed out, or with --baseline they fail without the break).
Exit 0 only if every entry run was CAUGHT; 2 for an unknown name. tests/test_protections.py checks the table
against the tree on every suite run; this script is not collected (no test_ prefix).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

from protections_table import TABLE, Protection

REPO = Path(__file__).resolve().parents[1]
# The venv's .pth that loads tests/megatron_record.py into every interpreter a recording test starts (the recorder
# names its own path there). It is aimed at the scratch copy's recorder for an entry's run (else the main tree's,
# unbroken, would record for a broken copy's tests: a break of the recorder MISSED), and put back afterwards.
SITE_HOOK = "zz_posaug_megatron_record.pth"
TIMEOUT_S = 1200  # one entry's pytest run; setup.cfg's per-test timeout is 900 s


def markdown() -> str:
    """The table as markdown: protection | broken how | tests that must fail."""
    rows = ["| protection | broken how | tests that must fail |", "|---|---|---|"]
    for entry in TABLE:
        tests = ", ".join(entry.tests) + (f" (-k {entry.keyword})" if entry.keyword else "")
        cells = (entry.protection, f"{entry.how} (`{entry.file}`; entry {entry.name})", tests)
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(rows) + "\n"


def stale_reason(entry: Protection, root: Path = REPO) -> str | None:
    """Why the break cannot be applied under `root` (one line), or None when its find string occurs exactly once."""
    path = root / entry.file
    if not path.is_file():
        return f"{entry.file} does not exist"
    count = path.read_text().count(entry.find)
    if count != 1:
        first = entry.find.strip().splitlines()[0]
        return f"the find string occurs {count} times in {entry.file}, not once: {first!r}"
    return None


def scratch_copy(destination: Path) -> None:
    """Copy the working tree's tracked and untracked-not-ignored files (not .venv) into `destination`."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True,
                            capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if not source.is_symlink() and not source.is_file():  # tracked but deleted in the working tree
            continue
        target = destination / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target, follow_symlinks=False)


def tests_python() -> str:
    """The interpreter the tests run with: the repository's .venv, else this one."""
    venv = REPO / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def _end(proc: subprocess.Popen) -> None:
    """End a pytest run's process group: SIGINT first so pytest tears its tests down, then harder."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=15)
            break
        except subprocess.TimeoutExpired:
            continue


def run_tests(entry: Protection, root: Path, python: str, timeout: float) -> tuple[int | None, str]:
    """(pytest's exit status or None on timeout, its output) for the entry's tests run in the tree at `root`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POSAUG_MEGATRON", "POSAUG_TEST_UNIT",
                                                                     "PYTEST_"))}
    env.update(dict(entry.env), PYTHONPATH=str(root))  # the scratch copy's packages, in every process a test starts
    command = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", *entry.tests]
    if entry.keyword:
        command += ["-k", entry.keyword]
    disposition = signal.SIG_IGN if entry.sigint_ignored else signal.SIG_DFL
    proc = subprocess.Popen(command, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, disposition))
    try:
        output = proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        _end(proc)
        return None, proc.communicate()[0]
    except BaseException:
        _end(proc)
        raise
    return proc.returncode, output


def _resolves_into(root: Path, python: str) -> str | None:
    """Where the scratch copy's pytest would import the packages from, when that is not the copy (else None)."""
    probe = ("import importlib.util as u; "
             "print(*(u.find_spec(m).origin for m in ('pretrain', 'megatron_ext', 'data_prep')))")
    origins = subprocess.run([python, "-c", probe], cwd=root, env=dict(os.environ, PYTHONPATH=str(root)),
                             capture_output=True, text=True).stdout.split()
    outside = [o for o in origins if not Path(o).resolve().is_relative_to(root.resolve())]
    return None if len(origins) == 3 and not outside else f"imports resolve outside the copy: {outside or origins}"


def _summary(output: str) -> str:
    """pytest's verdict lines: the first failure and the closing count."""
    lines = [line for line in output.splitlines() if line.strip()]
    failed = [line for line in lines if line.startswith(("FAILED ", "ERROR "))][:1]
    closing = [line.strip("= ") for line in lines if re.search(r"\b(passed|failed|error|skipped|deselected|no tests "
                                                                 r"ran)\b.* in [\d.]+s", line)][-1:]
    return "; ".join(part[:200] for part in failed + closing) or (lines[-1][:200] if lines else "no output")


def run_entry(entry: Protection, python: str, baseline: bool, timeout: float,
              hook: Path | None = None) -> tuple[str, str, str]:
    """(CAUGHT | MISSED | STALE | ERROR, one line saying why, pytest's output) for one entry, in a scratch copy."""
    reason = stale_reason(entry)
    if reason:
        return "STALE", reason, ""
    root = Path(tempfile.mkdtemp(prefix=f"protections_{entry.name}_")) / REPO.name
    try:
        scratch_copy(root)
        if (wrong := _resolves_into(root, python)) is not None:
            return "ERROR", wrong, ""
        with _site_hook_naming(hook, root):
            if baseline:
                code, output = run_tests(entry, root, python, timeout)
                if code != 0:
                    return "ERROR", f"without the break: pytest exit {code}: {_summary(output)}", output
            path = root / entry.file
            path.write_text(path.read_text().replace(entry.find, entry.replace, 1))
            code, output = run_tests(entry, root, python, timeout)
        status = {None: "ERROR", 0: "MISSED", 1: "CAUGHT"}.get(code, "ERROR")
        why = {None: f"timed out after {timeout:.0f} s: ", 0: "", 1: ""}.get(code, f"pytest exit {code}, no verdict: ")
        return status, why + _summary(output), output
    finally:
        _kill_leftovers(root)
        shutil.rmtree(root.parent, ignore_errors=True)


def _kill_leftovers(root: Path) -> None:
    """SIGKILL what the run left behind: a test's own session or a stopped rank escapes the group's signal (an
    interrupted hang test left its SIGSTOPped rank). Ours are the processes whose PYTHONPATH is the copy."""
    mark = b"\0PYTHONPATH=" + os.fsencode(root) + b"\0"
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and mark in b"\0" + Path(f"/proc/{entry}/environ").read_bytes():
                os.kill(int(entry), signal.SIGKILL)
        except OSError:  # gone meanwhile, or another user's
            continue


def _site_hook(python: str) -> Path:
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    return Path(purelib) / SITE_HOOK


@contextlib.contextmanager
def _site_hook_naming(hook: Path | None, root: Path) -> Iterator[None]:
    """Inside the block the site hook (SITE_HOOK) loads `root`'s recorder; after it, it is as it was before."""
    before = hook.read_bytes() if hook is not None and hook.exists() else None
    recorder = Path("tests", "megatron_record.py")  # only its path: the hook also names the venv's own directory
    if before is not None:
        _write_atomically(hook, before.replace(os.fsencode(REPO / recorder), os.fsencode(root / recorder)))
    try:
        yield
    finally:
        if hook is not None and (hook.read_bytes() if hook.exists() else None) != before:
            hook.unlink(missing_ok=True) if before is None else _write_atomically(hook, before)


def _write_atomically(path: Path, content: bytes) -> None:
    part = path.with_name(f".{path.name}.protections.{os.getpid()}")
    part.write_bytes(content)
    os.replace(part, path)  # interpreters may be starting


def _header(argv: list[str]) -> str:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True,
                             text=True).stdout.splitlines()
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    now = datetime.datetime.now(datetime.timezone.utc)
    return (f"# command: {' '.join(argv)}\n# commit: {head.stdout.strip()} ({len(changed)} tracked files changed in "
            f"the working tree)\n# date: {now:%Y-%m-%d %H:%M:%S} UTC\n# uptime: {uptime}\n")


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="entries to run (default: all)")
    parser.add_argument("--list", action="store_true", help="print the table as markdown and exit")
    parser.add_argument("--baseline", action="store_true", help="first run each entry's tests without the break")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds for one pytest run")
    parser.add_argument("--verbose", "-v", action="store_true", help="print the end of each pytest run's output")
    args = parser.parse_args(argv)
    entries = {entry.name: entry for entry in TABLE}
    unknown = [name for name in args.names if name not in entries]
    if unknown:
        print(f"error: unknown entries {', '.join(unknown)}; `--list` names them", file=sys.stderr)
        return 2
    if args.list:
        print(markdown(), end="")
        return 0
    chosen = [entries[name] for name in args.names] if args.names else list(TABLE)
    # Ctrl-C and a kill end through the same clean-up, even where a shell started this as a background job (SIGINT
    # ignored): the scratch copy and the pytest run's processes go with it.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.default_int_handler)
    python = tests_python()
    hook = _site_hook(python)
    print(_header([python, *(sys.argv if argv is None else [__file__, *argv])]), flush=True)
    counts: dict[str, int] = {}
    started = time.monotonic()
    try:
        for entry in chosen:
            began = time.monotonic()
            status, why, output = run_entry(entry, python, args.baseline, args.timeout, hook)
            counts[status] = counts.get(status, 0) + 1
            print(f"{status:<7} {entry.name:<28} {time.monotonic() - began:6.1f} s  {why}", flush=True)
            if args.verbose and output:
                print("".join(f"    {line}\n" for line in output.splitlines()[-40:]), end="", flush=True)
    except KeyboardInterrupt:
        print("interrupted: the scratch copy was removed", file=sys.stderr)
        return 130
    total = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    print(f"{len(chosen)} entries: {total} in {time.monotonic() - started:.1f} s")
    return 0 if counts.get("CAUGHT", 0) == len(chosen) else 1


if __name__ == "__main__":
    sys.exit(main())
