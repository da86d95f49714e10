"""A pre-imported parent that forks the suite's `python -m pretrain ...` processes (a zygote).

Why: every training, evaluation or export a test starts as `python -m pretrain` pays ~9 CPU-s of imports (torch,
megatron.core) before its first step, and the suite starts hundreds. tests/conftest.py makes `subprocess.Popen` of
such a command ask a server that imported those modules once to fork the process instead.

What the test gets is a real child process: its own pid, stdin/stdout/stderr (the Popen's own pipes, passed over a
Unix socket), cwd, environment, session or process group, signal dispositions of a fresh interpreter, and an exit
status the test reaps with waitpid like any child (Popen's own wait, poll, communicate, kill). It is the test's
child because the server forks a helper that forks the process and exits: the orphan is re-parented to the nearest
child subreaper, which the pytest process makes itself (PR_SET_CHILD_SUBREAPER) only while it waits for that.
The process then runs `runpy.run_module(module, run_name="__main__")` at the top of this file, so its exit status,
an uncaught exception's traceback and exit 1, a KeyboardInterrupt's death by SIGINT and atexit are the interpreter's
own, as under `python -m`.

Where a fork cannot be a fresh interpreter, the command is exec'ed as usual (`spawn_request` returns None):
- the command is not `sys.executable -m <ZYGOTE_MODULES>` with a plain Popen (no preexec_fn, user, umask or passed fds);
- its environment differs from the server's in a variable read at import time (IMPORT_TIME_ENV; the variables of
  libraries the server does not import, LATER_IMPORT_ENV, do not count): a server per such
  environment is started, at most MAX_SERVERS per pytest process, a new one replacing the least recently used (a
  module whose tests each set their own directories in such a variable would otherwise take every slot for good,
  and every later command of the worker would be exec'ed);
- POSAUG_ZYGOTE=0 in its environment (a test of process start-up itself);
- the server refused to serve: a warning was shown or a thread started while it imported (a fork copies one
  thread; a warning shown there would not reach the test's stderr).
Variables that the imports set (data_prep sets TOKENIZERS_PARALLELISM) are set again in each process, and
torch's and numpy's global generators start as in a new process. /proc/PID/cmdline and /proc/PID/environ show the
server's (the kernel lets only CAP_SYS_RESOURCE move them), so each forked process also writes its environment to a
file of this pytest process's ENVIRON_DIR, and `environ_of(pid)` reads that first: tests that find torchrun's ranks by
RANK use it and their ranks are forked too (the hang tests' three exec'ed processes cost ~10 CPU-s a launch). A test
that finds its processes by their command line sets POSAUG_ZYGOTE=0.

A command that starts such processes itself (NESTING: torchrun, whose ranks are `python -u -m pretrain` or a script
of tests/distributed/; `pretrain reproduce`, whose trainings are `python -m pretrain train`) gets a spare: a copy of
the server forked before the command begins, a child of the command that dies with it (PDEATHSIG), serving the
command's own Popen calls the same way, so that its ranks or trainings are its children, forked instead of exec'ed.
torchrun's worker variables (RUN_TIME_ENV) are read when a process group is made, not at import.
"""

from __future__ import annotations

import array
import collections
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import megatron_record
from pretrain.trainer.hang_exit import launch_environment, start_time

ZYGOTE_MODULES = ("pretrain", "torch.distributed.run")
# Scripts forked like modules: the programs the suite's torchrun launches run as ranks.
ZYGOTE_SCRIPT_DIRS = (str(Path(__file__).parent / "distributed"),)
# Commands that start forkable processes themselves: (module, first argument or None for any).
NESTING = (("torch.distributed.run", None), ("pretrain", "reproduce"))
# Imported once by the server: what a training, an evaluation and an export import before their first step.
PRELOAD = ("pretrain.tasks", "pretrain.plan.micro_batch", "pretrain.trainer.cli", "pretrain.trainer.loop",
           "pretrain.trainer.engine", "pretrain.trainer.checkpoint", "pretrain.evaluation", "pretrain.hf.export",
           "pretrain.experiments.reproduce_cli", "megatron.core", "megatron.core.models.gpt.gpt_layer_specs",
           "megatron.core.optimizer", "megatron.core.dist_checkpointing.strategies.torch",
           "megatron.core.dist_checkpointing.strategies.filesystem_async", "megatron_ext.rope_attention",
           "megatron_ext.sdpa_attention", "psutil", "numpy.random", "multiprocessing.managers")
IMPORT_TIME_ENV = ("PYTHON", "OMP_", "MKL_", "KMP_", "TORCH", "CUDA_", "LD_", "COVERAGE_", "MEGATRON", "TRITON")
# The variables of libraries PRELOAD does not import: a forked process that imports one reads them from its own
# environment, so they need no server of their own (test_wandb's per-test directories started a server per test,
# ~5 CPU-s each, and evicted the useful ones). A server whose imports load one of these libraries refuses to serve.
LATER_IMPORT_ENV = {"NVTE_": "transformer_engine", "TOKENIZERS_": "tokenizers", "HF_": "huggingface_hub",
                    "TRANSFORMERS": "transformers", "WANDB": "wandb"}
# Set by torchrun for its workers and read when a process group is created, never at import.
RUN_TIME_ENV = ("TORCHELASTIC_", "TORCH_NCCL_ASYNC_ERROR_HANDLING")
MAX_SERVERS = 3
# Where forked processes publish their environment: one directory per pytest process (a forked command's spare
# takes its client's from the request, so ranks under a forked torchrun publish where the test looks).
ENVIRON_DIR = f"/tmp/posaug-zygote-{os.getpid()}.environ"
_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER = 1, 36
_EXEC_POPEN = subprocess.Popen  # the servers themselves are exec'ed (conftest replaces subprocess.Popen)
_libc = ctypes.CDLL(None, use_errno=True)


def import_time_env(env: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """The variables of `env` that modules may read when they are imported."""
    return tuple(sorted((k, v) for k, v in env.items()
                        if k.startswith(IMPORT_TIME_ENV) and not k.startswith(RUN_TIME_ENV)))


# ------------------------------------------------------------------ client (the pytest process)


class Server:
    """One running zygote: its process and socket."""

    def __init__(self, env: dict[str, str]) -> None:
        self.socket_path = f"/tmp/posaug-zygote-{os.getpid()}-{id(self)}.sock"
        self.proc = _EXEC_POPEN([sys.executable, __file__, self.socket_path], env=env, cwd=Path(__file__).parents[1],
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
        self.ready = self.proc.stdout.readline().strip() == "ready"
        if not self.ready:
            self.proc.wait()

    @classmethod
    def spare(cls, address: str) -> "Server":
        """The spare this forked command was given (module docstring): served, not owned."""
        server = cls.__new__(cls)
        server.socket_path, server.proc, server.ready = address, None, True
        return server

    def spawn(self, request: dict, fds: list[int]) -> int:
        """Fork `request` with `fds` as its stdin/stdout/stderr; returns its pid once it is our child."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn, _subreaper():
            conn.connect(self.socket_path)
            payload = json.dumps(request).encode()
            conn.sendmsg([len(payload).to_bytes(8, "big") + payload],
                         [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
            pid = int(_read_all(conn))
            _wait_adopted(pid)
        return pid

    def close(self) -> None:
        """Stop the server."""
        if self.proc is None:  # a spare dies with the command it serves
            return
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        Path(self.socket_path).unlink(missing_ok=True)


_servers: collections.OrderedDict[tuple, Server] = collections.OrderedDict()  # least recently used first
_lock = threading.Lock()
_serving_spare = False  # this process is a forked command that was given a spare


def spawn_request(args, executable, preexec_fn, close_fds, pass_fds, cwd, env, shell, gid, gids, uid, umask,
                  start_new_session, process_group) -> dict | None:
    """The request that forks this Popen from a zygote, or None where it must be exec'ed."""
    if shell or preexec_fn is not None or not close_fds or pass_fds or executable not in (None, sys.executable):
        return None
    if any(value not in (None, -1) for value in (gid, gids, uid, umask)) or isinstance(args, (str, bytes)):
        return None
    args = [os.fsdecode(arg) for arg in args]
    if not args or args[0] != sys.executable:
        return None
    unbuffered = args[1:2] == ["-u"]
    rest = args[2:] if unbuffered else args[1:]
    if len(rest) >= 2 and rest[0] == "-m" and rest[1] in ZYGOTE_MODULES:
        target, argv = {"module": rest[1]}, rest[2:]
    elif rest and rest[0].endswith(".py") and os.path.dirname(os.path.abspath(rest[0])) in ZYGOTE_SCRIPT_DIRS:
        target, argv = {"script": os.path.abspath(rest[0])}, rest[1:]
    else:
        return None
    env = dict(os.environ if env is None else {os.fsdecode(k): os.fsdecode(v) for k, v in env.items()})
    if env.get("POSAUG_ZYGOTE") == "0":
        return None
    return {**target, "argv": argv, "unbuffered": unbuffered, "env": env,
            "cwd": os.path.abspath(cwd or os.getcwd()), "new_session": bool(start_new_session),
            "process_group": None if process_group in (None, -1) else process_group,
            "modules": list(ZYGOTE_MODULES), "script_dirs": list(ZYGOTE_SCRIPT_DIRS), "environ_dir": ENVIRON_DIR}


def server_for(env: dict[str, str]) -> Server | None:
    """The zygote for this import-time environment (started on first use), or None."""
    key = import_time_env(env)
    with _lock:
        if key in _servers:
            _servers.move_to_end(key)
        elif _serving_spare:  # a forked command starts no zygote of its own: what its spare cannot fork is exec'ed
            return None
        else:
            while len(_servers) >= MAX_SERVERS:  # its forked processes are the tests' children: they live on
                _servers.popitem(last=False)[1].close()
            env = {k: v for k, v in os.environ.items() if not k.startswith(IMPORT_TIME_ENV)} | dict(key)
            env.pop(megatron_record.UNIT_ENV, None)  # the server's own imports are no test's
            _servers[key] = Server(env)
        server = _servers[key]
    return server if server.ready else None


def close_all() -> None:
    """Stop every zygote of this process and remove the environments its forked processes published."""
    with _lock:
        for server in _servers.values():
            server.close()
        _servers.clear()
    if not _serving_spare:
        shutil.rmtree(ENVIRON_DIR, ignore_errors=True)


def environ_of(pid: int) -> dict[str, str]:
    """A process's environment: the one it published if it was forked from a zygote, else /proc/PID/environ."""
    published = Path(ENVIRON_DIR, f"{pid}-{start_time(pid)}.json")  # a pid is reused, this pair is not
    if published.exists():
        return json.loads(published.read_text())
    found = launch_environment(pid)
    if found is None:
        raise ProcessLookupError(f"no process {pid}")
    return found


class ZygotePopen(subprocess.Popen):
    """subprocess.Popen that forks `python -m pretrain ...` from a zygote (module docstring); exec otherwise."""

    def _execute_child(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo,
                       creationflags, shell, p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite,
                       restore_signals, gid, gids, uid, umask, start_new_session, process_group):
        request = spawn_request(args, executable, preexec_fn, close_fds, pass_fds, cwd, env, shell, gid, gids, uid,
                                umask, start_new_session, process_group)
        server = server_for(request["env"]) if request else None
        if server is None:
            if megatron_record.exec_counts(args, env):
                megatron_record.record("exec")
            return super()._execute_child(args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo,
                                          creationflags, shell, p2cread, p2cwrite, c2pread, c2pwrite, errread,
                                          errwrite, restore_signals, gid, gids, uid, umask, start_new_session,
                                          process_group)
        if not os.path.isdir(request["cwd"]):  # what exec's chdir would raise
            raise FileNotFoundError(2, os.strerror(2), request["cwd"])
        try:
            self.pid = server.spawn(request, [p2cread if p2cread != -1 else 0, c2pwrite if c2pwrite != -1 else 1,
                                              errwrite if errwrite != -1 else 2])
            self._child_created = True
        finally:
            self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)


class _subreaper:
    """This process is a child subreaper inside the block (and only there: daemons a test starts stay init's)."""

    def __enter__(self):
        _lock.acquire()
        _libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)

    def __exit__(self, *exc):
        _libc.prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        _lock.release()


def _wait_adopted(pid: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        if int(fields[1]) == os.getpid():
            return
        time.sleep(0.0005)
    raise RuntimeError(f"zygote child {pid} was not re-parented to this process")


def _read_all(conn: socket.socket) -> bytes:
    data = b""
    while chunk := conn.recv(4096):
        data += chunk
    return data


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    fds = array.array("i")
    message, ancillary, _, _ = conn.recvmsg(1 << 20, socket.CMSG_SPACE(3 * fds.itemsize))
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    size = int.from_bytes(message[:8], "big")
    payload = message[8:]
    while len(payload) < size:
        payload += conn.recv(size - len(payload))
    return json.loads(payload), list(fds)


# ------------------------------------------------------------------ server (this file run as a script)


def _preload() -> tuple[dict[str, str], bytes] | None:
    """Import PRELOAD; returns (variables the imports set, torch's fresh generator state), or None to refuse."""
    import importlib
    import warnings

    before = dict(os.environ)
    from pretrain.console import quiet_known_warnings

    quiet_known_warnings()  # as `python -m pretrain` does before its imports
    with warnings.catch_warnings(record=True) as shown:
        import torch

        fresh_rng = torch.get_rng_state()
        for module in PRELOAD:
            importlib.import_module(module)
    loaded = sorted(library for library in LATER_IMPORT_ENV.values() if library in sys.modules)
    if loaded:
        print(f"zygote {os.getpid()}: not serving (its imports loaded {loaded}, whose variables LATER_IMPORT_ENV "
              f"leaves out of the server's key)", file=sys.stderr)
        return None
    if shown or threading.active_count() != 1 or len(os.listdir("/proc/self/task")) != 1:
        tasks = [Path(f"/proc/self/task/{task}/comm").read_text().strip() for task in os.listdir("/proc/self/task")]
        print(f"zygote {os.getpid()}: not serving ({len(shown)} warnings shown: {[str(w.message) for w in shown]}; "
              f"threads {tasks})", file=sys.stderr)
        return None
    added = {k: v for k, v in os.environ.items() if k not in before}
    import gc

    gc.freeze()  # the preloaded objects are never collected: a process's collections do not touch their pages
    return added, bytes(fresh_rng.numpy())


def _listen(address: str) -> socket.socket:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(64)
    return listener


def _serve(listener: socket.socket) -> tuple[dict, list[int]]:
    """Fork a process per request; returns only in such a process, with its request and stdin/stdout/stderr."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the helpers are reaped by the kernel
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    while True:
        conn, _ = listener.accept()
        if os.fork() != 0:
            conn.close()
            continue
        listener.close()  # the helper: fork the process, say its pid, exit so that it is re-parented
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # a process that ends at once stays a zombie, to be re-parented
        request, fds = _receive(conn)
        sys.stdout.flush()
        sys.stderr.flush()
        request["helper"] = os.getpid()
        pid = os.fork()
        if pid == 0:
            conn.close()
            return request, fds
        conn.sendall(str(pid).encode())
        # a helper slow to exit, on demand: the process must still start as the test's child (tests/test_zygote.py)
        time.sleep(float(request["env"].get("POSAUG_ZYGOTE_HELPER_LINGER", "0")))
        os._exit(0)


def _nests(request: dict) -> bool:
    """Does this command start forkable processes itself (NESTING)?"""
    first = request["argv"][0] if request["argv"] else None
    return any(request.get("module") == module and argument in (None, first) for module, argument in NESTING)


def _fork_spare(request: dict, fds: list[int]) -> socket.socket | None:
    """In a forked command that nests: fork the spare; returns its listener in the spare, None in the command."""
    address = f"\0posaug-zygote-spare-{os.getpid()}"  # abstract: no file left behind when the command is killed
    listener = _listen(address)
    command = os.getpid()
    if os.fork() == 0:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != command:  # the command died before the line above
            os._exit(0)
        for fd in set(fds):
            os.close(fd)
        return listener
    listener.close()
    request["spare"] = address
    return None


def _become(request: dict, fds: list[int], added_env: dict[str, str], fresh_rng: bytes) -> None:
    """Turn this forked process into `python -m <module> <argv>` as exec would have started it."""
    import io

    while os.getppid() == request["helper"]:  # start once re-parented: getppid() is the test's, as when exec'ed
        time.sleep(0.0005)
    if request["new_session"]:
        os.setsid()
    elif request["process_group"] is not None:
        os.setpgid(0, request["process_group"])
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(fds) - {0, 1, 2}:
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for key, value in added_env.items():
        os.environ.setdefault(key, value)
    _publish_environ(request["environ_dir"])
    for number in range(1, signal.NSIG):  # a fresh interpreter's dispositions
        if number in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            signal.signal(number, signal.SIG_DFL)
        except (OSError, ValueError):
            pass
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for ignored in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(ignored, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    signal.set_wakeup_fd(-1)
    unbuffered = request["unbuffered"] or bool(os.environ.get("PYTHONUNBUFFERED"))  # -u or the variable
    for name, fd, mode in (("stdin", 0, "r"), ("stdout", 1, "w"), ("stderr", 2, "w")):
        binary = io.open(fd, mode + "b", buffering=0 if unbuffered and mode == "w" else -1, closefd=False)
        stream = io.TextIOWrapper(binary, encoding=getattr(sys, name).encoding, errors=getattr(sys, name).errors,
                                  line_buffering=not unbuffered and (fd == 2 or os.isatty(fd)) and mode == "w",
                                  write_through=unbuffered and mode == "w")
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
    import numpy
    import torch

    numpy.random.seed()
    torch.set_rng_state(torch.frombuffer(bytearray(fresh_rng), dtype=torch.uint8))
    sys.path[0] = os.path.dirname(request["script"]) if "script" in request else request["cwd"]


def _publish_environ(directory: str) -> None:
    """Write this process's environment where `environ_of` finds it (written whole, then renamed into place)."""
    os.makedirs(directory, exist_ok=True)
    path = Path(directory, f"{os.getpid()}-{start_time(os.getpid())}.json")
    path.with_suffix(".tmp").write_text(json.dumps(dict(os.environ)))
    path.with_suffix(".tmp").rename(path)


def _run(request: dict) -> None:
    """Run the request's module or script as __main__ and exit as the interpreter would, without tearing down the server's modules.

    The interpreter's exit path: non-daemon threads joined, atexit handlers (weakref finalizers, multiprocessing,
    logging, coverage) run, streams flushed, the exit status of SystemExit, 1 and a traceback for an exception, death
    by SIGINT for an uncaught KeyboardInterrupt. What is skipped is the teardown of every module, which in a copy of
    the server's memory costs ~1.5 s of copy-on-write faults; multiprocessing's forked children skip it the same way."""
    import atexit
    import runpy
    import traceback

    code, interrupted = 0, False
    try:
        if "script" in request:
            runpy.run_path(request["script"], run_name="__main__")
        else:
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            code = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        traceback.print_exc()
        interrupted = True
    except BaseException:  # noqa: B036  everything the interpreter would report
        sys.excepthook(*sys.exc_info())
        code = 1
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code & 0xFF)


def _attach_spare(request: dict) -> None:
    """Fork this command's own `python -m pretrain` and rank processes from its spare (module docstring)."""
    global ZYGOTE_MODULES, ZYGOTE_SCRIPT_DIRS, ENVIRON_DIR, _serving_spare
    ZYGOTE_MODULES, ZYGOTE_SCRIPT_DIRS = tuple(request["modules"]), tuple(request["script_dirs"])
    ENVIRON_DIR = request["environ_dir"]
    _serving_spare = True
    _servers[import_time_env(request["server_env"])] = Server.spare(request["spare"])
    subprocess.Popen = ZygotePopen
    handler = sys.modules.get("torch.distributed.elastic.multiprocessing.subprocess_handler.subprocess_handler")
    if handler is not None:  # imported by the server: its `from subprocess import Popen` is bound already
        handler.Popen = ZygotePopen


if __name__ == "__main__":
    sys.path[0] = os.getcwd()  # as under `python -m`: the server's cwd is the repository
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # the server ends with the pytest process
    if os.environ.get(megatron_record.RECORD_ENV):
        megatron_record.install()  # inherited by every forked process, which records for its test
    _preloaded = _preload()
    if _preloaded is None:
        sys.exit(3)
    _listener = _listen(sys.argv[1])
    print("ready", flush=True)
    while True:
        _request, _fds = _serve(_listener)  # from here on, a forked process
        if not _nests(_request):
            break
        _listener = _fork_spare(_request, _fds)
        if _listener is None:  # the command; the spare goes round the loop and serves it
            break
    _request["server_env"] = dict(os.environ)
    _become(_request, _fds, *_preloaded)
    if "spare" in _request:
        _attach_spare(_request)
    sys.argv = [_request.get("script") or _request["module"], *_request["argv"]]
    _run(_request)
