"""A warm `posttrain` for the tests' subprocesses: the same CLI, without paying for its imports on every call.

The orchestration tests run `posttrain` many times through real launchers (`dvc repro`, Airflow's tasks, the
Kubeflow YAML runner), and each call spends most of its time importing torch, transformers and MLflow. Here one
server process per test worker imports them once and forks a child for each call. `tool_env()` puts a directory
holding a `posttrain` shim first on PATH, so every launcher that finds `posttrain` on PATH reaches the server:

- The shim (stdlib only, starts in milliseconds) sends its argv, environment and working directory, with its own
  stdin / stdout / stderr as file descriptors, over a Unix socket. The child takes them over, then runs
  `posttrain.cli.main()`, the installed script's entry point.
- The shim forwards the signals a launcher sends to stop a task (TERM, INT, HUP, USR1/2) to the child, and the
  child's exit status comes back to the shim, which exits with it; a child killed by a signal makes the shim
  kill itself with that signal, so the launcher sees what it would see from the real process.
- Killing the shim (a launcher's kill -9 of the task, a timeout) kills the child: the child watches the socket,
  and its peer's end closing is the shim's death.
- A call the server cannot stand in for exactly runs the real script instead: the shim execs it when its
  PYTHONPATH differs from the server's (other code), or when the server is not up within a bound.

The server listens on a socket in a private temporary directory, exits when the process that started it ends,
and is stopped by process id at exit.
"""

from __future__ import annotations

import array
import atexit
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

REAL = Path(sys.executable).with_name("posttrain")
# imported once by the server: every module of the package, and what its functions import when they run
PRELOAD = ("torch", "transformers", "mlflow", "safetensors.torch", "pandas", "pyarrow", "matplotlib.pyplot", "great_expectations",
           "peft", "datasets", "tokenizers", "diffusers", "posttrain.cli")

SHIM = '''#!{python} -IS
import array, json, os, signal, socket, struct, sys, time
SOCKET, REAL, SERVER_PYTHONPATH = {socket!r}, {real!r}, {pythonpath!r}
def real():
    os.execv(REAL, [REAL, *sys.argv[1:]])
if os.environ.get("PYTHONPATH", "") != SERVER_PYTHONPATH or os.environ.get("POSTTRAIN_WARM") == "0":
    real()
deadline = time.monotonic() + {wait_s}
while True:
    try:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(SOCKET)
        break
    except OSError:
        conn.close()
        if time.monotonic() > deadline:
            real()
        time.sleep(0.05)
request = json.dumps({{"argv": sys.argv, "env": dict(os.environ), "cwd": os.getcwd()}}).encode()
conn.sendmsg([struct.pack("!I", len(request))], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0, 1, 2]))])
conn.sendall(request)
def receive():
    data = b""
    while len(data) < 4:
        chunk = conn.recv(4 - len(data))
        if not chunk:  # the server died without a status
            sys.exit(255)
        data += chunk
    return struct.unpack("!i", data)[0]
child = receive()
for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(number, lambda number, frame: os.kill(child, number))  # what the process would have received
status = receive()
if os.WIFSIGNALED(status):
    signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
    os.kill(os.getpid(), os.WTERMSIG(status))
sys.exit(os.waitstatus_to_exitcode(status))
'''


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the shim went away")
        data += chunk
    return data


def _child(conn: socket.socket, listener: socket.socket, fds: list[int], request: dict) -> None:
    """In the forked child: become the shim's `posttrain` process, run the CLI, exit with its status."""
    listener.close()
    for number in signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP}:  # a new interpreter's handlers (the
        signal.signal(number, signal.SIG_DFL)  # server's imports may have installed their own)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    sys.stdin = open(0, "r", closefd=False)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = request["argv"]

    def orphaned() -> None:  # the shim's end closed: it was killed, so is this process
        try:
            while conn.recv(1):
                pass
        finally:
            os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=orphaned, daemon=True).start()
    code = 1
    try:
        from posttrain.cli import main

        main()
        code = 0
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        try:
            atexit._run_exitfuncs()  # what the interpreter runs at a normal exit (MLflow ends its active run there)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)


def _preload() -> None:
    import importlib
    import pkgutil

    import posttrain

    for module in PRELOAD:
        importlib.import_module(module)
    for info in pkgutil.walk_packages(posttrain.__path__, "posttrain."):
        try:
            importlib.import_module(info.name)
        except Exception:  # an optional extra that is not installed: the child imports (and fails) as the real one would
            pass


def _serve(path: str, parent: int) -> None:
    _preload()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".tmp")
    os.rename(path + ".tmp", path)  # shims connect only once it listens
    listener.listen(64)
    listener.settimeout(1.0)
    while os.getppid() == parent:
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        conn.settimeout(None)
        fds = array.array("i")
        header, ancillary, _, _ = conn.recvmsg(4, socket.CMSG_LEN(3 * fds.itemsize))
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
        request = json.loads(_recv_exact(conn, struct.unpack("!I", header)[0]))
        pid = os.fork()
        if pid == 0:
            _child(conn, listener, list(fds), request)
        for fd in fds:
            os.close(fd)
        conn.sendall(struct.pack("!i", pid))
        threading.Thread(target=_report, args=(conn, pid), daemon=True).start()


def _report(conn: socket.socket, pid: int) -> None:
    """Wait for the child; send its raw wait status to the shim (gone already if the shim was killed)."""
    _, status = os.waitpid(pid, 0)
    try:
        conn.sendall(struct.pack("!i", status))
    except OSError:
        pass
    finally:
        conn.close()


_bin: Path | None = None


def shim_dir() -> Path:
    """A directory with the `posttrain` shim, its server started (once per process) in the background."""
    global _bin
    if _bin is None:
        root = Path(tempfile.mkdtemp(prefix="posttrain-warm-"))
        path = str(root / "cli.sock")
        server = subprocess.Popen([sys.executable, __file__, path, str(os.getpid())], stdin=subprocess.DEVNULL, start_new_session=True)
        atexit.register(_stop, server)
        (root / "bin").mkdir()
        shim = root / "bin" / "posttrain"
        shim.write_text(SHIM.format(python=sys.executable, socket=path, real=str(REAL), pythonpath=os.environ.get("PYTHONPATH", ""), wait_s=120))
        shim.chmod(0o755)
        _bin = root / "bin"
    return _bin


def _stop(server: subprocess.Popen) -> None:
    server.kill()
    server.wait(timeout=30)


if __name__ == "__main__":
    _serve(sys.argv[1], int(sys.argv[2]))
