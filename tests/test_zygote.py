"""The suite's zygote (tests/zygote.py): a forked `python -m ...` behaves as an exec'ed one where a test can tell.

Each behaviour is run both ways, forked from a zygote and exec'ed (POSAUG_ZYGOTE=0), on a probe module in tmp_path
and on the real `python -m pretrain`; the two must agree."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import zygote
from conftest import REPO, TINY_TRAIN, wait_for_step

ENV = dict(os.environ, PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="")  # what the suite's commands run with
PROBE = textwrap.dedent("""
    import atexit, os, signal, sys, threading, time
    what = sys.argv[1]
    if what == "exit":
        sys.exit(int(sys.argv[2]))
    if what == "raise":
        raise ValueError("probe failure")
    if what == "interrupt":
        raise KeyboardInterrupt
    if what == "message":
        sys.exit("a message exit")
    if what == "atexit":
        atexit.register(lambda: print("atexit ran", flush=True))
        threading.Thread(target=lambda: (time.sleep(0.2), print("thread joined", flush=True))).start()
        print("main done")
    if what == "state":
        print(os.getcwd(), os.environ.get("PROBE_VALUE"), sys.argv[0].endswith("probe.py"), sys.path[0] == os.getcwd())
        print(signal.getsignal(signal.SIGINT) is signal.default_int_handler, signal.getsignal(signal.SIGTERM),
              signal.getsignal(signal.SIGCHLD), signal.getsignal(signal.SIGPIPE), signal.pthread_sigmask(0, []))
        print(os.getsid(0) == os.getpid(), os.getppid() == int(os.environ["PROBE_PARENT"]))
        print(sys.stdin.read(), sys.stdout.line_buffering, sys.stderr.line_buffering)
    if what == "wait":
        print("waiting", flush=True)
        time.sleep(60)
""")


@pytest.fixture
def probe(tmp_path, monkeypatch):
    """Run the probe module forked (zygote=True) or exec'ed; returns (returncode, stdout, stderr)."""
    (tmp_path / "probe.py").write_text(PROBE)
    monkeypatch.setattr(zygote, "ZYGOTE_MODULES", ("pretrain", "probe"))

    def run(*args: str, forked: bool, stdin: str = "", extra_env: dict | None = None, **popen):
        env = dict(ENV, PROBE_VALUE="42", PROBE_PARENT=str(os.getpid()), POSAUG_ZYGOTE="1" if forked else "0",
                   **(extra_env or {}))
        proc = zygote.ZygotePopen([sys.executable, "-m", "probe", *args], cwd=tmp_path, env=env, text=True,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)
        out, err = proc.communicate(stdin, timeout=120)
        return proc.returncode, out, err
    return run


def _forked(pid: int) -> bool:
    return b"zygote.py" in Path(f"/proc/{pid}/cmdline").read_bytes()


@pytest.mark.parametrize("args, code", [(("exit", "0"), 0), (("exit", "7"), 7), (("raise",), 1),
                                        (("interrupt",), -signal.SIGINT), (("message",), 1)])
def test_exit_status_and_streams_equal_an_exec(probe, args, code):
    forked, exec_ = probe(*args, forked=True), probe(*args, forked=False)
    assert forked[0] == exec_[0] == code
    assert forked[1] == exec_[1]
    assert forked[2].splitlines()[-1:] == exec_[2].splitlines()[-1:]  # the traceback's frames above differ


def test_atexit_handlers_run_and_threads_are_joined_before_exit(probe):
    assert probe("atexit", forked=True)[1].splitlines() == ["main done", "thread joined", "atexit ran"]


def test_cwd_environment_argv_signals_session_and_stdin_are_a_fresh_processes(probe):
    forked = probe("state", forked=True, stdin="from stdin", start_new_session=True)
    assert forked == probe("state", forked=False, stdin="from stdin", start_new_session=True)
    assert forked[1].splitlines()[2] == "True True"  # its own session, and the test's child


def test_a_forked_process_starts_as_the_tests_child_however_long_its_helper_takes_to_exit(probe):
    # the helper forks the process and exits; the process must not run its module before it is re-parented
    lingering = probe("state", forked=True, extra_env={"POSAUG_ZYGOTE_HELPER_LINGER": "0.5"})
    assert lingering[1].splitlines()[2].endswith(" True"), lingering


def test_the_forked_process_is_the_tests_child_and_dies_of_the_signal_sent_to_its_group(probe, tmp_path):
    (tmp_path / "probe.py").write_text(PROBE)
    proc = zygote.ZygotePopen([sys.executable, "-m", "probe", "wait"], cwd=tmp_path, env=ENV, stdout=subprocess.PIPE,
                              text=True, start_new_session=True)
    assert proc.stdout.readline() == "waiting\n"
    assert _forked(proc.pid) and os.getpgid(proc.pid) == proc.pid
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=30) == -signal.SIGTERM


@pytest.mark.parametrize("forked", [True, False], ids=["forked", "exec"])
def test_environ_of_gives_the_processs_own_environment_where_proc_shows_the_servers(probe, tmp_path, forked):
    (tmp_path / "probe.py").write_text(PROBE)
    proc = zygote.ZygotePopen([sys.executable, "-m", "probe", "wait"], cwd=tmp_path, stdout=subprocess.PIPE,
                              text=True, env=dict(ENV, PROBE_VALUE="its own", POSAUG_ZYGOTE="1" if forked else "0"))
    try:
        assert proc.stdout.readline() == "waiting\n" and _forked(proc.pid) == forked
        assert zygote.environ_of(proc.pid)["PROBE_VALUE"] == "its own"
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_pretrain_commands_are_forked_and_others_exec_ed():
    env = ENV
    pretrain = zygote.ZygotePopen([sys.executable, "-m", "pretrain", "nope"], env=env, stderr=subprocess.PIPE)
    other = zygote.ZygotePopen([sys.executable, "-c", "import time; time.sleep(1)"], env=env)
    opted_out = zygote.ZygotePopen([sys.executable, "-m", "pretrain", "nope"], env=dict(env, POSAUG_ZYGOTE="0"),
                                   stderr=subprocess.PIPE)
    assert [_forked(p.pid) for p in (pretrain, other, opted_out)] == [True, False, False]
    assert pretrain.wait(timeout=60) == opted_out.wait(timeout=60) == 2
    other.wait(timeout=60)


RANK_PROBE = textwrap.dedent("""
    import os, signal, sys, time
    forked = "zygote.py" in open("/proc/self/cmdline").read()
    print("RANK", os.environ["RANK"], os.environ["LOCAL_RANK"], os.environ["WORLD_SIZE"], os.getsid(0) == os.getpid(),
          os.getppid(), sys.argv[1:], sys.path[0] == os.path.dirname(__file__),
          signal.getsignal(signal.SIGINT) is signal.default_int_handler, sys.stdout.write_through, "FORKED", forked,
          flush=True)
    if os.environ["RANK"] == "0":
        open("rank0.printed", "w").close()
        sys.exit(0)
    for _ in range(600):  # rank 1 fails once rank 0 has printed: torchrun then stops the other ranks
        if os.path.exists("rank0.printed"):
            break
        time.sleep(0.1)
    sys.exit(3)
""")


@pytest.mark.parametrize("forked", [True, False], ids=["forked", "exec"])
def test_torchrun_forks_its_ranks_from_its_spare_and_they_behave_as_exec_ed_ranks(tmp_path, monkeypatch, forked):
    (tmp_path / "rank_probe.py").write_text(RANK_PROBE)
    monkeypatch.setattr(zygote, "ZYGOTE_SCRIPT_DIRS", (*zygote.ZYGOTE_SCRIPT_DIRS, str(tmp_path)))
    env = dict(ENV, POSAUG_ZYGOTE="1" if forked else "0")
    proc = zygote.ZygotePopen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                               str(tmp_path / "rank_probe.py"), "an-argument"], cwd=tmp_path, text=True,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert _forked(proc.pid) == forked
    out, err = proc.communicate(timeout=120)
    ranks = sorted(line.split() for line in out.splitlines() if line.startswith("RANK"))
    assert proc.returncode == 1 and "exitcode  : 3" in err, err[-3000:]  # rank 1's exit code, as torchrun reports it
    assert [r[1:4] for r in ranks] == [["0", "0", "2"], ["1", "1", "2"]]
    expected = ["True", str(proc.pid), "['an-argument']", "True", "True", "True", "FORKED", str(forked)]
    assert [r[4:] for r in ranks] == [expected, expected], out


def test_torchrun_and_reproduce_nest_and_other_commands_do_not():
    nests = [zygote._nests({"module": module, "argv": argv}) for module, argv in (
        ("torch.distributed.run", ["--standalone", "x.py"]), ("pretrain", ["reproduce", "--suite", "x"]),
        ("pretrain", ["train", "--set", "x=1"]), ("pretrain", []))]
    assert nests == [True, True, False, False]


def test_an_import_time_variable_gets_a_server_of_its_own():
    base = ENV
    assert zygote.server_for(base) is not zygote.server_for(dict(base, OMP_NUM_THREADS="2"))
    assert zygote.server_for(base) is zygote.server_for(dict(base, PRETRAIN_PLAN_CACHE="/elsewhere"))


def test_a_variable_of_a_library_the_server_never_imported_shares_its_server():
    base = ENV
    assert zygote.server_for(base) is zygote.server_for(dict(base, WANDB_DIR="/elsewhere", HF_HOME="/elsewhere"))


def test_a_server_whose_imports_load_a_library_of_those_variables_refuses_to_serve():
    probe = "import sys, zygote; zygote.PRELOAD += ('wandb',); sys.exit(7 if zygote._preload() is None else 0)"
    proc = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env=dict(ENV, PYTHONPATH=f"{REPO / 'tests'}:{REPO}"))
    assert proc.returncode == 7 and "its imports loaded ['wandb']" in proc.stderr, proc.stderr[-2000:]


def test_a_new_environment_past_the_limit_replaces_the_least_recently_used_server(monkeypatch):
    zygote.server_for(ENV)
    monkeypatch.setattr(zygote, "MAX_SERVERS", len(zygote._servers))
    least_recent = next(iter(zygote._servers.values()))
    newest = zygote.server_for(dict(ENV, TORCH_ZYGOTE_TEST_ONLY=str(time.time())))
    assert newest is not None and least_recent.proc.poll() is not None
    assert least_recent not in zygote._servers.values() and len(zygote._servers) == zygote.MAX_SERVERS


@pytest.mark.slow
@pytest.mark.parametrize("forked", [True, False], ids=["forked", "exec"])
def test_sigterm_to_a_trainings_process_group_saves_and_exits_with_the_requeue_code(tmp_path, forked):
    from pretrain.trainer.config import REQUEUE_EXIT_CODE

    env = dict(ENV, POSAUG_ZYGOTE="1" if forked else "0")
    proc = zygote.ZygotePopen([sys.executable, "-m", "pretrain", "train", "--set", *TINY_TRAIN, "data.synthetic=true",
                               "schedule.train_iters=1000", f"checkpoint.save={tmp_path / 'run'}"],
                              cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True)
    assert _forked(proc.pid) == forked
    wait_for_step(proc, 2)
    started = time.monotonic()
    os.killpg(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == REQUEUE_EXIT_CODE, err[-3000:]
    assert any(Path(tmp_path, "run").glob("iter_*")) and time.monotonic() - started < 120
