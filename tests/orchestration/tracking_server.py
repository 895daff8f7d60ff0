"""A shared MLflow tracking server for the tests, as teams run one: `mlflow server` on 127.0.0.1 backed by PostgreSQL
(Debian's binaries, a throw-away cluster on a loopback port) with its artifacts in a loopback S3 bucket (moto).

`tracking_server(server)` starts the three on `server`'s ports and stops them by process id. The tests share one per
session, for every pytest-xdist worker (an Airflow-triggered run on one worker and a locally executed Kubeflow run on
the other log to the same store): the first worker that needs it starts this file as a supervisor
(`python tracking_server.py STATE OWNER`), which runs the servers until OWNER (the pytest controller) has exited or
it is sent SIGTERM. The fixtures are in conftest.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # helpers, when run as the supervisor script
from airflow_servers import _stop as stop_group  # noqa: E402  (a process group, by its id; killed if it lingers)
from helpers import BIN, free_port, moto_server  # noqa: E402

POSTGRES_BIN = max(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name), default=Path("/usr/lib/postgresql/15/bin"))  # Debian's
BUCKET = "posttrain-mlflow"
NOBODY = 65534  # initdb and postgres refuse to run as root: the cluster belongs to `nobody`
READY_TIMEOUT = 180  # seconds, for each server (mlflow migrates a fresh database first)


@dataclass(frozen=True)
class TrackingServer:
    """Where the shared server listens (its ports are chosen before it starts, so clients can be set up meanwhile)."""

    url: str  # tracking.uri of every client
    artifact_root: str  # tracking.artifact_root: the bucket the clients (and the server, for its UI) read and write
    s3_endpoint: str
    database: str  # the backend store, as the server is given it
    root: str  # its logs and state files

    @property
    def env(self) -> dict[str, str]:
        """What a client process needs on top of the tests' AWS_* credentials to reach the artifacts."""
        return {"MLFLOW_S3_ENDPOINT_URL": self.s3_endpoint}

    @property
    def overrides(self) -> tuple[str, ...]:
        """The `--set`s that make a run log here."""
        return (f"tracking.uri={self.url}", f"tracking.artifact_root={self.artifact_root}")

    def wait(self) -> TrackingServer:
        """Block until the server answers (bounded); fails with the supervisor's log if it died."""
        root = Path(self.root)
        deadline = time.time() + 3 * READY_TIMEOUT
        while not (root / "ready").is_file():
            pid = int((root / "supervisor.pid").read_text())
            assert _alive(pid), f"the tracking server did not start:\n{(root / 'supervisor.log').read_text()[-4000:]}"
            assert time.time() < deadline, f"the tracking server was not ready in {3 * READY_TIMEOUT} s"
            time.sleep(0.3)
        return self

    @classmethod
    def on_free_ports(cls, root: Path) -> TrackingServer:
        mlflow, s3, pg = free_port(), free_port(), free_port()
        return cls(f"http://127.0.0.1:{mlflow}", f"s3://{BUCKET}/mlartifacts", f"http://127.0.0.1:{s3}",
                   f"postgresql+psycopg2://posttrain@127.0.0.1:{pg}/mlflow", str(root))

    @staticmethod
    def port(url: str) -> int:
        return int(url.rsplit(":", 1)[1].split("/")[0])


def compare_pipeline_run(server: TrackingServer, params: Path, pipeline_run: str, out: Path, monkeypatch) -> list[dict]:
    """`posttrain compare` (in this process) of the runs of `pipeline_run` in the server's experiment, as a sweep's
    compare task runs it: its comparison.json rows."""
    from helpers import posttrain_in_process

    for key, value in {**server.env, "POSTTRAIN_PIPELINE_RUN": pipeline_run}.items():
        monkeypatch.setenv(key, value)
    sets = [arg for override in server.overrides for arg in ("--set", override)]
    posttrain_in_process("compare", "--params", str(params), *sets, "--out", str(out))
    return json.loads((out / "comparison.json").read_text())


def _wait(ready, process: subprocess.Popen, what: str, log: Path) -> None:
    deadline = time.time() + READY_TIMEOUT
    while time.time() < deadline:
        assert process.poll() is None, f"{what} exited ({process.returncode}):\n{log.read_text()[-3000:]}"
        with contextlib.suppress(Exception):
            if ready():
                return
        time.sleep(0.3)
    raise AssertionError(f"{what} not ready in {READY_TIMEOUT} s:\n{log.read_text()[-3000:]}")


def _as_nobody(*command: str) -> list[str]:
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *command]


@contextlib.contextmanager
def postgres(logs: Path, port: int, database: str = "mlflow", max_connections: int = 40) -> Iterator[None]:
    """A fresh PostgreSQL cluster on 127.0.0.1:`port` with a database `database` (owner `posttrain`, trust auth on
    loopback), its log `logs/postgres-<database>.log`. The cluster lies in a temp folder outside pytest's (those are root's alone), owned by `nobody`, and is
    removed at the end."""
    import psycopg2

    data = Path(tempfile.mkdtemp(prefix="posttrain-pg-"))
    os.chown(data, NOBODY, NOBODY)
    initdb = subprocess.run(_as_nobody(str(POSTGRES_BIN / "initdb"), "-D", str(data / "db"), "-U", "posttrain", "-A", "trust", "-E", "UTF8",
                                       "--no-sync"), cwd=data, capture_output=True, text=True, timeout=120)
    assert initdb.returncode == 0, initdb.stdout[-2000:] + initdb.stderr[-2000:]
    log = logs / f"postgres-{database}.log"
    settings = ["listen_addresses=127.0.0.1", f"port={port}", f"unix_socket_directories={data}", "fsync=off", "synchronous_commit=off",
                "full_page_writes=off", "shared_buffers=16MB", f"max_connections={max_connections}"]
    with open(log, "w") as out:
        server = subprocess.Popen(_as_nobody(str(POSTGRES_BIN / "postgres"), "-D", str(data / "db"), *(f"-c{s}" for s in settings)),
                                  cwd=data, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait(lambda: psycopg2.connect(host="127.0.0.1", port=port, user="posttrain", dbname="postgres").close() is None, server, "postgres", log)
        connection = psycopg2.connect(host="127.0.0.1", port=port, user="posttrain", dbname="postgres")
        connection.autocommit = True
        with connection.cursor() as cursor:
            cursor.execute(f"CREATE DATABASE {database}")
        connection.close()
        yield
    finally:
        stop_group(server)  # its clients (the MLflow server) are gone: a smart shutdown is quick
        shutil.rmtree(data, ignore_errors=True)


@contextlib.contextmanager
def tracking_server(server: TrackingServer) -> Iterator[TrackingServer]:
    """PostgreSQL, a moto S3 with the bucket, and `mlflow server` on them, all on 127.0.0.1 at `server`'s ports; stopped
    by process id. The database URI says psycopg2: SQLAlchemy 2.1 reads a bare postgresql:// as psycopg 3."""
    logs = Path(server.root)
    with moto_server(BUCKET, port=server.port(server.s3_endpoint)) as _, postgres(logs, server.port(server.database)):
        env = {**os.environ, **server.env, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        log = logs / "mlflow-server.log"
        command = [str(BIN / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(server.port(server.url)), "--workers", "1",
                   "--backend-store-uri", server.database, "--artifacts-destination", f"s3://{BUCKET}/proxied"]
        with open(log, "w") as out:
            process = subprocess.Popen(command, env=env, cwd=logs, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            _wait(lambda: urllib.request.urlopen(server.url + "/health", timeout=5).status == 200, process, "mlflow server", log)
            yield server
        finally:
            stop_group(process)


def start_shared(root: Path, owner: int) -> TrackingServer:
    """The tracking server of this test session, starting (`.wait()` for it): the first caller starts a supervisor
    process (this file) that runs it until `owner`, the process whose end is the session's end, has exited. Callers
    hold a lock around this."""
    found, supervisor = root / "server.json", root / "supervisor.pid"
    if found.is_file() and supervisor.is_file() and _alive(int(supervisor.read_text())):
        return TrackingServer(**json.loads(found.read_text()))
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    server = TrackingServer.on_free_ports(root)
    found.write_text(json.dumps(asdict(server)))
    with open(root / "supervisor.log", "w") as out:
        process = subprocess.Popen([sys.executable, __file__, str(found), str(owner)], stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    supervisor.write_text(str(process.pid))
    return server


def stop_shared(server: TrackingServer) -> None:
    """Stop the supervisor (and with it the servers) now, by its process id."""
    pid = int((Path(server.root) / "supervisor.pid").read_text())
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.time() + 60
    while _alive(pid) and time.time() < deadline:
        time.sleep(0.2)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError):  # a zombie (exited, not yet reaped by its parent) is gone
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    return True


def _supervise(found: Path, owner: int) -> None:
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    with tracking_server(TrackingServer(**json.loads(found.read_text()))):
        (found.parent / "ready").touch()
        while not stopping and _alive(owner):
            time.sleep(1)


if __name__ == "__main__":
    _supervise(Path(sys.argv[1]), int(sys.argv[2]))
