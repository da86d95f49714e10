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
- its environment differs from the server's in a variable read at import time (IMPORT_TIME_ENV): a server per such
  environment is started, at most MAX_SERVERS per pytest process, a new one replacing the least recently used (a
  module whose tests each set their own directories in such a variable would otherwise take every slot for good,
  and every later command of the worker would be exec'ed);
- POSAUG_ZYGOTE=0 in its environment (a test of process start-up itself);
- the server refused to serve: a warning was shown or a thread started while it imported (a fork copies one
  thread; a warning shown there would not reach the test's stderr).
Variables that the imports set (data_prep sets TOKENIZERS_PARALLELISM) are set again in each process, and
torch's and numpy's global generators start as in a new process. /proc/PID/cmdline shows the server's command line.
"""

from __future__ import annotations

import array
import collections
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import megatron_record

ZYGOTE_MODULES = ("pretrain",)
# Imported once by the server: what a training, an evaluation and an export import before their first step.
PRELOAD = ("pretrain.tasks", "pretrain.plan.micro_batch", "pretrain.trainer.cli", "pretrain.trainer.loop",
           "pretrain.trainer.engine", "pretrain.trainer.checkpoint", "pretrain.evaluation", "pretrain.hf.export",
           "pretrain.experiments.reproduce_cli", "megatron.core", "megatron.core.models.gpt.gpt_layer_specs",
           "megatron.core.optimizer", "megatron.core.dist_checkpointing.strategies.torch",
           "megatron.core.dist_checkpointing.strategies.filesystem_async", "megatron_ext.rope_attention",
           "megatron_ext.sdpa_attention", "psutil", "numpy.random", "multiprocessing.managers")
IMPORT_TIME_ENV = ("PYTHON", "OMP_", "MKL_", "KMP_", "TORCH", "CUDA_", "LD_", "COVERAGE_", "MEGATRON", "NVTE_",
                   "TRITON", "TOKENIZERS_", "HF_", "TRANSFORMERS", "WANDB")
MAX_SERVERS = 3
_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER = 1, 36
_EXEC_POPEN = subprocess.Popen  # the servers themselves are exec'ed (conftest replaces subprocess.Popen)
_libc = ctypes.CDLL(None, use_errno=True)


def import_time_env(env: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """The variables of `env` that modules may read when they are imported."""
    return tuple(sorted((k, v) for k, v in env.items() if k.startswith(IMPORT_TIME_ENV)))


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
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        Path(self.socket_path).unlink(missing_ok=True)


_servers: collections.OrderedDict[tuple, Server] = collections.OrderedDict()  # least recently used first
_lock = threading.Lock()


def spawn_request(args, executable, preexec_fn, close_fds, pass_fds, cwd, env, shell, gid, gids, uid, umask,
                  start_new_session, process_group) -> dict | None:
    """The request that forks this Popen from a zygote, or None where it must be exec'ed."""
    if shell or preexec_fn is not None or not close_fds or pass_fds or executable not in (None, sys.executable):
        return None
    if any(value not in (None, -1) for value in (gid, gids, uid, umask)) or isinstance(args, (str, bytes)):
        return None
    args = [os.fsdecode(arg) for arg in args]
    if len(args) < 3 or args[0] != sys.executable or args[1] != "-m" or args[2] not in ZYGOTE_MODULES:
        return None
    env = dict(os.environ if env is None else {os.fsdecode(k): os.fsdecode(v) for k, v in env.items()})
    if env.get("POSAUG_ZYGOTE") == "0":
        return None
    return {"module": args[2], "argv": args[3:], "env": env, "cwd": os.path.abspath(cwd or os.getcwd()),
            "new_session": bool(start_new_session), "process_group": None if process_group in (None, -1)
            else process_group}


def server_for(env: dict[str, str]) -> Server | None:
    """The zygote for this import-time environment (started on first use), or None."""
    key = import_time_env(env)
    with _lock:
        if key in _servers:
            _servers.move_to_end(key)
        else:
            while len(_servers) >= MAX_SERVERS:  # its forked processes are the tests' children: they live on
                _servers.popitem(last=False)[1].close()
            env = {k: v for k, v in os.environ.items() if not k.startswith(IMPORT_TIME_ENV)} | dict(key)
            env.pop(megatron_record.MODULE_ENV, None)  # the server's own imports are no test's
            _servers[key] = Server(env)
        server = _servers[key]
    return server if server.ready else None


def close_all() -> None:
    """Stop every zygote of this process."""
    with _lock:
        for server in _servers.values():
            server.close()
        _servers.clear()


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
    if shown or threading.active_count() != 1 or len(os.listdir("/proc/self/task")) != 1:
        tasks = [Path(f"/proc/self/task/{task}/comm").read_text().strip() for task in os.listdir("/proc/self/task")]
        print(f"zygote {os.getpid()}: not serving ({len(shown)} warnings shown: {[str(w.message) for w in shown]}; "
              f"threads {tasks})", file=sys.stderr)
        return None
    added = {k: v for k, v in os.environ.items() if k not in before}
    import gc

    gc.freeze()  # the preloaded objects are never collected: a process's collections do not touch their pages
    return added, bytes(fresh_rng.numpy())


def _serve(socket_path: str) -> tuple[dict, list[int], dict[str, str], bytes]:
    """Fork a process per request; returns only in such a process, with what it needs to become the command."""
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # the server ends with the pytest process
    if os.environ.get(megatron_record.RECORD_ENV):
        megatron_record.install()  # inherited by every forked process, which records for its test
    preloaded = _preload()
    if preloaded is None:
        sys.exit(3)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(64)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the helpers are reaped by the kernel
    print("ready", flush=True)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
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
            os.close(devnull)
            return (request, fds, *preloaded)
        conn.sendall(str(pid).encode())
        os._exit(0)


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
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
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
    sys.path[0] = request["cwd"]


def _run(module: str) -> None:
    """Run `module` as __main__ and exit as the interpreter would, without tearing down the server's modules.

    The interpreter's exit path: non-daemon threads joined, atexit handlers (weakref finalizers, multiprocessing,
    logging, coverage) run, streams flushed, the exit status of SystemExit, 1 and a traceback for an exception, death
    by SIGINT for an uncaught KeyboardInterrupt. What is skipped is the teardown of every module, which in a copy of
    the server's memory costs ~1.5 s of copy-on-write faults; multiprocessing's forked children skip it the same way."""
    import atexit
    import runpy
    import traceback

    code, interrupted = 0, False
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
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


if __name__ == "__main__":
    sys.path[0] = os.getcwd()  # as under `python -m`: the server's cwd is the repository
    _request, _fds, _added_env, _fresh_rng = _serve(sys.argv[1])
    _become(_request, _fds, _added_env, _fresh_rng)
    sys.argv = [_request["module"], *_request["argv"]]
    _run(_request["module"])
