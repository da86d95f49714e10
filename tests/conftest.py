"""Shared fixtures: a single-process Megatron world, a torchrun launcher with a timeout; warning filters and the
session's MFU peak cache."""

import os

# One OpenMP thread per process, set before anything imports torch, and inherited by every process a test starts
# (trainings, torchrun ranks, SLURM jobs submitted from here). The suite runs 4 workers on 2 cores, each starting
# trainings: torch's default (a thread per core) makes OpenMP threads wait for a core, and waiting threads spin. A
# 20-step tiny training beside two busy processes: 3.1x the CPU and 2.3x the wall time on torch's default
# (benchmarks/bench_test_threads.py; benchmarks/results/bench_test_threads_2026-11-29.txt).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import megatron_record
import unit_times
import zygote

pytest_plugins = ("signal_guard",)  # restores a signal disposition a test leaves changed, and names the test
REPO = Path(__file__).resolve().parents[1]
_unit_times: unit_times.UnitTimes | None = None


def pytest_configure(config):
    """Warning filters and the measured-peak cache of this session (set before any test module builds an env)."""
    from pretrain.console import KNOWN_HARMLESS

    # The library warnings `python -m pretrain` silences for users are ignored in tests too (setup.cfg explains).
    for known in KNOWN_HARMLESS:
        assert ":" not in known.message + known.module, f"pytest filter fields are ':'-separated: {known.message}"
        config.addinivalue_line("filterwarnings", f"ignore:{known.message}:{known.category.__name__}:{known.module}")
    # `python -m pretrain ...` processes are forked from a pre-imported zygote (tests/zygote.py says how and when not)
    subprocess.Popen = zygote.ZygotePopen
    if not config.pluginmanager.has_plugin("posaug-shared-fixture-units"):  # once: a test's pytest run loads it too
        config.pluginmanager.register(SharedFixtureUnits(), "posaug-shared-fixture-units")
    if os.environ.get(megatron_record.RECORD_ENV):  # the pinned phase notes which tests use Megatron-Core
        megatron_record.install_site_hook()
        megatron_record.install()
        if not hasattr(config, "workerinput"):
            config.megatron_live = megatron_record.mark_live()
    global _unit_times
    if not hasattr(config, "workerinput"):  # an xdist worker has it; the controller receives every report
        _unit_times = unit_times.UnitTimes(_work_unit)
    # Runs started by tests measure the MFU peak into a session directory, not ~/.cache/posaug.
    if "POSAUG_CACHE_DIR" not in os.environ:
        config.peak_cache_dir = tempfile.mkdtemp(prefix="posaug_peak_cache_")
        os.environ["POSAUG_CACHE_DIR"] = config.peak_cache_dir


# ------------------------------------------------------------------ parallel workers (issue 43)
# `make test` runs the suite on pytest-xdist workers with `--dist loadfile`: a work unit is one test module, so
# its module-scoped fixtures (a tiny model trained once, a cluster job submitted once) run on one worker, except
# that the tests submitting jobs to a local SLURM cluster form one unit per cluster: each cluster is shared daemons
# with a node's worth of CPUs per node, so its jobs run one test at a time, as in a serial run, while the two
# clusters (own daemons, ports and munge) run side by side. (xdist's own `loadgroup` marks do not group on
# pytest 9, whose test ids no longer come from the attribute xdist rewrites.)
CLUSTER_MODULES = frozenset({"tests/slurm/test_grid_on_cluster.py", "tests/slurm/test_slurm_cluster.py",
                             "tests/slurm/test_slurm_hang.py", "tests/slurm/test_slurm_two_nodes.py",
                             "tests/slurm/test_launcher_preflight.py"})
# The two-node cluster's tests (slurm/local/start_two_nodes.sh); every other test of CLUSTER_MODULES submits to
# the single-node one. A listed test that no longer exists stops the run at collection (a renamed test would
# otherwise move silently to the other unit).
TWO_NODE_TESTS = frozenset({
    "tests/slurm/test_slurm_two_nodes.py",
    "tests/slurm/test_slurm_hang.py::test_a_partition_between_the_nodes_ends_the_job_in_the_timeout_names_the_node_and_"
    "the_requeue_resumes",
    "tests/slurm/test_grid_on_cluster.py::test_on_the_two_node_cluster_the_grid_trains_each_run_across_both_nodes_to_"
    "its_report",
})


def _work_unit(nodeid: str) -> str:
    """The xdist work unit of a test: its module, or the cluster it submits to."""
    module = _module(nodeid)
    if module not in CLUSTER_MODULES:
        return module
    test = nodeid.split("[")[0]
    return "two-node SLURM cluster" if module in TWO_NODE_TESTS or test in TWO_NODE_TESTS else "SLURM cluster"


def _module(nodeid: str) -> str:
    return nodeid.split("::")[0]


@pytest.hookimpl(optionalhook=True)  # xdist's hook: absent when a developer runs without pytest-xdist
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile` with the cluster modules as one work unit (see CLUSTER_MODULES)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModulesAndClusters(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _work_unit(nodeid)

    return ModulesAndClusters(config, log)


def pytest_addoption(parser):
    """--megatron-record FILE and --megatron-slow TESTS: the newest megatron-core phase's selection."""
    parser.addoption("--megatron-record", default=None, help="a record of tests/megatron_record.py: run only the "
                     "fast tests it names (the newest megatron-core phase); every fast test when the file is missing")
    parser.addoption("--megatron-slow", default="", help="with --megatron-record: the slow tests to run too (paths "
                     "or test ids, space-separated)")


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    """Name the test module being imported (megatron_record: its module-level imports count for all its tests)."""
    if not isinstance(collector, pytest.Module):
        return (yield)
    os.environ[megatron_record.UNIT_ENV] = _module(collector.nodeid)
    try:
        return (yield)
    finally:
        os.environ.pop(megatron_record.UNIT_ENV, None)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Name the test running now, for this process and every process its tests start (megatron_record)."""
    os.environ[megatron_record.UNIT_ENV] = item.nodeid
    try:
        return (yield)
    finally:
        os.environ.pop(megatron_record.UNIT_ENV, None)


class SharedFixtureUnits:
    """A shared fixture's setup counts for every test that uses it (megatron_record), not only the first.

    A plugin registered in pytest_configure, not a hook of this conftest: pytest calls a conftest's fixture-setup hook
    only for fixtures whose node lies under the conftest's folder, and a session-scoped fixture's node is the session,
    at the rootdir above tests/, so megatron_world's setup was recorded as the first test using it (on each worker: the
    newest phase then selected 501 or 574 tests from one run to the next, and missed the other users)."""

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        if fixturedef.scope == "function":
            return (yield)
        running = os.environ.get(megatron_record.UNIT_ENV)
        os.environ[megatron_record.UNIT_ENV] = f"fixture:{fixturedef.argname}"
        try:
            return (yield)
        finally:
            if running is None:
                os.environ.pop(megatron_record.UNIT_ENV, None)
            else:
                os.environ[megatron_record.UNIT_ENV] = running


def _newest_megatron_selection(config, items) -> None:
    record = config.getoption("--megatron-record")
    if record is None:
        return
    slow_wanted = config.getoption("--megatron-slow").split()
    units = None  # None: every fast test
    if not Path(record).is_file():
        print(f"\n--megatron-record: no record at {record}; running every fast test")
    else:
        units = megatron_record.recorded_units(Path(record))
        if megatron_record.UNATTRIBUTED in units:
            print(f"\n--megatron-record: {record} names a process started without the recording environment "
                  f"(its '{megatron_record.UNATTRIBUTED}' lines say which); running every fast test")
            units = None
    keep, deselected = [], []
    for item in items:
        if item.get_closest_marker("slow"):
            chosen = any(item.nodeid == test or item.nodeid.startswith((f"{test}::", f"{test}["))
                         for test in slow_wanted)
        else:
            chosen = units is None or megatron_record.selected(item.nodeid, item.fixturenames, units)
        (keep if chosen else deselected).append(item)
    items[:] = keep
    config.hook.pytest_deselected(items=deselected)


def pytest_collection_modifyitems(config, items):
    """Check CLUSTER_MODULES against the `cluster` marks and start the slowest work first."""
    _newest_megatron_selection(config, items)
    marked = {_module(item.nodeid) for item in items if item.get_closest_marker("cluster")}
    collected = {_module(item.nodeid) for item in items}
    if marked != CLUSTER_MODULES & collected:
        raise pytest.UsageError(f"tests/conftest.py CLUSTER_MODULES must list exactly the modules with "
                                f"pytest.mark.cluster: {sorted(marked)}")
    gone = [test for test in TWO_NODE_TESTS
            if "::" in test and f"def {test.split('::')[1]}(" not in (REPO / _module(test)).read_text()]
    if gone:
        raise pytest.UsageError(f"tests/conftest.py TWO_NODE_TESTS names tests that do not exist: {sorted(gone)}")
    slow_modules = {_module(item.nodeid) for item in items if item.get_closest_marker("slow")}

    def start_order(item) -> int:
        # with --no-loadscope-reorder the workers take work in this order: the two long serial cluster units first
        # (the critical path), then the modules that train, then the rest (file order within each)
        if _module(item.nodeid) in CLUSTER_MODULES:
            return 0
        return 1 if _module(item.nodeid) in slow_modules else 2

    items.sort(key=start_order)


def _cpu_of_phase(item, when: str):
    start = unit_times.cpu_seconds_now()
    try:
        return (yield)
    finally:  # a failing phase used its CPU too
        item.stash.setdefault(_PHASE_CPU, {})[when] = unit_times.cpu_seconds_now() - start


_PHASE_CPU = pytest.StashKey[dict]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    """Measure the CPU time of the setup phase (unit_times)."""
    yield from _cpu_of_phase(item, "setup")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """Measure the CPU time of the call phase (unit_times)."""
    yield from _cpu_of_phase(item, "call")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """Measure the CPU time of the teardown phase (unit_times)."""
    yield from _cpu_of_phase(item, "teardown")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Carry the phase's CPU time in its report (xdist forwards user_properties to the controller)."""
    report = yield
    report.user_properties.append(("cpu_seconds", item.stash.get(_PHASE_CPU, {}).get(call.when, 0.0)))
    return report


def pytest_runtest_logreport(report):
    """Count each test's time towards its work unit (on the controller only: workers forward their reports)."""
    if _unit_times is not None:
        cpu = next((value for key, value in report.user_properties if key == "cpu_seconds"), 0.0)
        _unit_times.add(report.nodeid, report.duration, cpu)


def pytest_terminal_summary(terminalreporter):
    """The time per work unit (tests/unit_times.py)."""
    if _unit_times is not None:
        unit_times.report(_unit_times, terminalreporter)


def pytest_unconfigure(config):
    """Stop this process's zygotes, remove the session's peak cache and end its recording's live mark."""
    zygote.close_all()
    if getattr(config, "megatron_live", None):
        config.megatron_live.unlink(missing_ok=True)
    if getattr(config, "peak_cache_dir", None):
        shutil.rmtree(config.peak_cache_dir, ignore_errors=True)
        os.environ.pop("POSAUG_CACHE_DIR", None)


@pytest.fixture(scope="session")
def megatron_world():
    """Megatron parallel state for one gloo process (TP=PP=1), shared by in-process tests."""
    from megatron_ext.model import ParallelConfig
    from pretrain.trainer import distributed

    distributed.initialize(ParallelConfig(), seed=1234)
    yield
    distributed.destroy()


def run_torchrun(script: str, nproc: int, *args: str, timeout: float = 300) -> list[dict]:
    """Run `script` under torchrun (gloo, CPU) and return the JSON records printed as 'RESULT {...}'."""
    env = dict(os.environ, PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               str(REPO / script), *args]
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(command)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return results(proc.stdout)


def results(stdout: str) -> list[dict]:
    """Every 'RESULT {...}' record in `stdout`, also where two ranks' lines ran together without a newline."""
    decoder, records = json.JSONDecoder(), []
    start = stdout.find("RESULT ")
    while start != -1:
        record, end = decoder.raw_decode(stdout, start + len("RESULT "))
        records.append(record)
        start = stdout.find("RESULT ", end)
    return records


@pytest.fixture(scope="session")
def tiny_shards(tmp_path_factory) -> str:
    """data_prep output prefix of a small real-text corpus (the embedded one), 512-token SentencePiece."""
    from data_prep.cli import main as data_prep

    root = tmp_path_factory.mktemp("tiny_data")
    assert data_prep(["embedded-corpus", "--output", str(root / "corpus"), "--max-bytes", "400000"]) == 0
    assert data_prep(["train-tokenizer", "--input", str(root / "corpus"), "--output", str(root / "tok"),
                      "--kind", "sentencepiece-bpe", "--vocab-size", "512"]) == 0
    prefix = str(root / "shards" / "tiny")
    assert data_prep(["build", "--input", str(root / "corpus"), "--tokenizer", str(root / "tok"),
                      "--data-prefix", prefix, "--num-shards", "2", "--valid-fraction", "0.1",
                      "--no-progress"]) == 0
    return prefix


TINY_TRAIN = ["preset=tiny", "model.vocab_size=512", "schedule.global_batch_size=8", "schedule.micro_batch_size=2",
              "optimizer.lr=3e-3", "optimizer.min_lr=3e-4", "optimizer.lr_warmup_iters=2",
              "logging.log_interval=1", "logging.eval_interval=4", "logging.eval_iters=1"]


def run_train(overrides: list[str], nproc: int = 1, timeout: float = 300, check: bool = True):
    """`python -m pretrain train --set ...` (under torchrun when nproc > 1); returns the CompletedProcess."""
    env = dict(os.environ, PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="")
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
                 "-m", "pretrain"] if nproc > 1 else [sys.executable, "-m", "pretrain"])
    proc = subprocess.run([*launcher, "train", "--set", *overrides], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"training failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


def one_error_line(proc, exit_code: int = 2) -> str:
    """The single 'error:' line of a command that must fail cleanly with `exit_code`, without a traceback."""
    assert proc.returncode == exit_code, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr[-4000:]
    return errors[0]


def wait_for_step(proc, step: int, timeout: float = 240) -> None:
    """Read a training process's stdout until its 'step N/' line (kill it and fail after `timeout`)."""
    deadline = time.time() + timeout
    for line in proc.stdout:
        if line.startswith(f"step {step}/"):
            return
        if time.time() > deadline:
            break
    proc.kill()
    raise AssertionError(f"never reached step {step}")


def tensorboard_scalars(run_dir, tag: str) -> dict[int, float]:
    """{step: value} of one scalar across every event file of a run (later files win)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    values: dict[int, float] = {}
    for events in sorted(Path(run_dir, "tensorboard").glob("events.out.tfevents.*"), key=os.path.getmtime):
        accumulator = EventAccumulator(str(events))
        accumulator.Reload()
        if tag in accumulator.Tags()["scalars"]:
            values.update({e.step: e.value for e in accumulator.Scalars(tag)})
    return values


# ------------------------------------------------------------------ real disk faults (issue 23)


class SmallDisk:
    """A real tmpfs mounted at `path` for one test: a real full disk (ENOSPC) and a real read-only one (EROFS).

    chmod does not stop root, so read-only is a read-only remount; the filesystem is unmounted by the fixture."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _mount(self, *args: str) -> None:
        subprocess.run(["mount", *args, str(self.path)], check=True, capture_output=True, timeout=30)

    def free(self) -> int:
        """Bytes free on the disk now."""
        stat = os.statvfs(self.path)
        return stat.f_bavail * stat.f_frsize

    def fill(self, leave: int = 0) -> None:
        """Fill the disk with a filler file until at most `leave` bytes are free."""
        with open(self.path / ".filler", "ab") as handle:
            block = b"\0" * (1 << 16)
            try:
                while self.free() > leave:
                    handle.write(block[:max(4096, min(len(block), self.free() - leave))])
                    handle.flush()
            except OSError:
                pass

    def read_only(self) -> None:
        """Remount the disk read-only (what a failed disk or an ro NFS export does to a job)."""
        self._mount("-o", "remount,ro")

    def writable(self) -> None:
        """Remount the disk read-write."""
        self._mount("-o", "remount,rw")


@pytest.fixture
def small_disk(tmp_path):
    """Factory: small_disk(size="4m") mounts a fresh tmpfs under tmp_path; every mount is undone afterwards.

    Needs root (or CAP_SYS_ADMIN), as `make test` and CI have; elsewhere the test is skipped with the reason."""
    mounted: list[Path] = []

    def mount(size: str = "4m") -> SmallDisk:
        path = tmp_path / f"disk{len(mounted)}"
        path.mkdir()
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                              capture_output=True, text=True, timeout=30)
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs for a real full/read-only disk (needs root): {proc.stderr.strip()}")
        mounted.append(path)
        return SmallDisk(path)

    yield mount
    for path in reversed(mounted):
        if subprocess.run(["umount", str(path)], capture_output=True, timeout=30).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


def file_hashes(directory) -> dict[str, str]:
    """{relative path: sha256} of every file under `directory` (to show what a failure left untouched)."""
    import hashlib

    directory = Path(directory)
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group `pgid`."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.append(int(entry.name))
    return members


def wait_group_gone(pgid: int, timeout: float = 15) -> list[int]:
    """The group's processes still alive after `timeout` seconds (none expected)."""
    deadline = time.time() + timeout
    while group_members(pgid) and time.time() < deadline:
        time.sleep(0.1)
    left = group_members(pgid)
    for pid in left:  # never leave them running, whatever the test says
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left
