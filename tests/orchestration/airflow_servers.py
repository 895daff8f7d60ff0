"""A real Airflow on loopback for the tests: `airflow api-server` (127.0.0.1), `scheduler` and `dag-processor` with a
temporary AIRFLOW_HOME and a PostgreSQL metadata database of their own (as Airflow is deployed: on SQLite, three
servers writing one file under load answered the UI's trigger with "Database error" in CI), driven through the REST API the UI's Trigger button uses, stopped by process id."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from orch_helpers import BIN, tool_env

from helpers import REPO, free_port

DAGS = REPO / "dags"
ARTIFACTS = REPO / "outputs" / "test-artifacts"  # kept after the tests: the closing notes' figures
FINISHED = {"success", "failed"}


def airflow_env(home: Path, **extra: str) -> dict[str, str]:
    return tool_env(**{
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        # the DAG-parsing tests' metadata DB (airflow_servers runs on PostgreSQL): wait up to a minute for its lock
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}?timeout=60",
        "POSTTRAIN_RUNS_DIR": str(home / "runs"),
        "POSTTRAIN_AIRFLOW_RETRIES": "0",  # unless `extra` says otherwise, a failing stage fails the run at once
        **extra,
    })


@dataclass
class Airflow:
    """The REST API of a running Airflow (`/api/v2`), with a bearer token from the simple auth manager."""

    url: str
    home: Path
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    token: str = ""

    def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {self.token}"} if self.token else {})}
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=120) as response:  # a loaded api-server can take a minute
                return response.status, json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as e:
            text = e.read()
            try:
                return e.code, json.loads(text)
            except ValueError:
                return e.code, {"detail": text.decode(errors="replace")}

    def trigger(self, dag_id: str, conf: dict) -> tuple[int, dict]:
        """What the UI's Trigger button sends: a manual run with the form's values as `conf`."""
        return self.request("POST", f"/api/v2/dags/{dag_id}/dagRuns", {"logical_date": None, "conf": conf})

    def wait(self, dag_id: str, run_id: str, timeout: float) -> str:
        deadline = time.time() + timeout
        while time.time() < deadline:
            with contextlib.suppress(TimeoutError, urllib.error.URLError):  # a loaded api-server answers late: ask again
                _, run = self.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")
                if run.get("state") in FINISHED:
                    return run["state"]
            self.check_alive()
            time.sleep(2)
        raise AssertionError(f"{dag_id} run {run_id} did not finish in {timeout:.0f} s: {self.task_states(dag_id, run_id)}\n{self.logs()}")

    def task_instances(self, dag_id: str, run_id: str) -> dict[str, dict]:
        """The run's task instances by task id (`objective[0]` for a mapped one): state, try_number, duration, ..."""
        _, found = self.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances?limit=100")
        return {t["task_id"] + (f"[{t['map_index']}]" if t.get("map_index", -1) >= 0 else ""): t for t in found.get("task_instances", [])}

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str]:
        return {name: t["state"] for name, t in self.task_instances(dag_id, run_id).items()}

    def record_wall_time(self, name: str, dag_id: str, run_id: str, note: str = "") -> dict:
        """The finished run's wall time (its start to its end) and its tasks' summed durations, merged into
        outputs/test-artifacts/airflow_wall_times.json under `name` (several test processes may write it)."""
        from filelock import FileLock

        _, run = self.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")
        wall = datetime.fromisoformat(run["end_date"]) - datetime.fromisoformat(run["start_date"])
        tasks = self.task_instances(dag_id, run_id).values()
        entry = {"dag": dag_id, "run_id": run_id, "state": run["state"], "wall_s": round(wall.total_seconds(), 1),
                 "task_s": round(sum(t["duration"] or 0.0 for t in tasks), 1), "tasks": len(tasks), "note": note}
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / "airflow_wall_times.json"
        with FileLock(str(path) + ".lock"):
            found = json.loads(path.read_text()) if path.is_file() else {}
            path.write_text(json.dumps({**found, name: entry}, indent=1) + "\n")
        print(f"airflow wall time: {name} ({dag_id}) {entry['wall_s']} s, tasks {entry['task_s']} s")
        return entry

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1) -> str:
        _, found = self.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}?full_content=true")
        content = found.get("content", "")
        return json.dumps(content) if not isinstance(content, str) else content

    def check_alive(self) -> None:
        dead = {name: p.returncode for name, p in self.processes.items() if p.poll() is not None}
        assert not dead, f"airflow servers exited: {dead}\n{self.logs()}"

    def logs(self) -> str:
        return "\n".join(f"--- {name}\n{(self.home / f'{name}.log').read_text()[-1500:]}" for name in self.processes)


def _stop(process: subprocess.Popen) -> None:
    """Its process group (the api-server's workers, the scheduler's executor), by the id we started it with."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


@contextlib.contextmanager
def airflow_servers(home: Path, dag_ids: tuple[str, ...], timeout: float = 480, **dag_env: str) -> Iterator[Airflow]:
    """api-server, scheduler and dag-processor on a fresh PostgreSQL metadata DB; yields once `dag_ids` are parsed and
    unpaused. `dag_env`: more variables of their environment (the DAG files read POSTTRAIN_AIRFLOW_RETRIES, ...)."""
    from tracking_server import postgres  # (it imports this module)

    home.mkdir(parents=True, exist_ok=True)
    port, database = free_port(), free_port()
    with postgres(home, database, database="airflow", max_connections=100):
        yield from _servers(home, port, database, dag_ids, timeout, dag_env)


def _servers(home: Path, port: int, database: int, dag_ids: tuple[str, ...], timeout: float, dag_env: dict[str, str]) -> Iterator[Airflow]:
    env = airflow_env(
        home,
        **dag_env,
        AIRFLOW__CORE__PARALLELISM="2",
        AIRFLOW__CORE__EXECUTION_API_SERVER_URL=f"http://127.0.0.1:{port}/execution/",
        AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION="False",
        AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC="2",
        AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL="5",
        # the DAG files do not change while the tests run: parse them once. (By default every 30 s, each parse killed
        # after 50 s; on a loaded machine a parse took longer, and its DAGs went stale for minutes, scheduling nothing.)
        AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL="3600",
        AIRFLOW__DAG_PROCESSOR__DAG_FILE_PROCESSOR_TIMEOUT="600",
        AIRFLOW__DAG_PROCESSOR__STALE_DAG_THRESHOLD="600",
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS="admin:admin",
        # a task's first call to the execution API can wait long on a loaded machine's api-server (one worker): its
        # default 5 s, retried, fails the task before it runs ("state is queued")
        AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT="120",
        AIRFLOW__API__BASE_URL=f"http://127.0.0.1:{port}",
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"postgresql+psycopg2://posttrain@127.0.0.1:{database}/airflow",
    )
    migrated = subprocess.run([str(BIN / "airflow"), "db", "migrate"], env=env, capture_output=True, text=True, timeout=300)
    assert migrated.returncode == 0, migrated.stderr[-2000:]
    api = Airflow(f"http://127.0.0.1:{port}", home)
    commands = {
        "api-server": ["api-server", "-H", "127.0.0.1", "-p", str(port), "-w", "1"],
        "scheduler": ["scheduler", "--skip-serve-logs"],
        "dag-processor": ["dag-processor"],
    }
    try:
        for name, args in commands.items():
            log = open(home / f"{name}.log", "w")  # noqa: SIM115  (kept open while the server runs)
            api.processes[name] = subprocess.Popen([str(BIN / "airflow"), *args], env=env, cwd=home, stdout=log, stderr=subprocess.STDOUT,
                                                   start_new_session=True)
        deadline = time.time() + timeout
        while time.time() < deadline:
            api.check_alive()
            with contextlib.suppress(OSError):
                if not api.token:
                    status, found = api.request("POST", "/auth/token", {"username": "admin", "password": _password(home)})
                    api.token = found.get("access_token", "") if status in (200, 201) else ""
                if api.token:
                    _, found = api.request("GET", "/api/v2/dags?limit=100")
                    parsed = {d["dag_id"]: d for d in found.get("dags", [])}
                    if set(dag_ids) <= set(parsed):
                        for dag_id in dag_ids:
                            if parsed[dag_id]["is_paused"]:
                                api.request("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False})
                        break
            time.sleep(1)
        else:
            raise AssertionError(f"airflow did not parse {dag_ids} in {timeout:.0f} s\n{api.logs()}")
        yield api
    finally:
        for process in api.processes.values():
            _stop(process)


def _password(home: Path) -> str:
    """The simple auth manager's generated password of `admin`."""
    generated = home / "simple_auth_manager_passwords.json.generated"
    return json.loads(generated.read_text()).get("admin", "") if generated.is_file() else ""


def stage_processes(out: Path) -> set[int]:
    """The processes of the stage writing `out`: the holder recorded in its output lock (the `posttrain` process that
    trains: with the warm CLI a fork of its server) and every process started as `posttrain ... --out <out>` (the
    task's command: the warm shim, or the real script)."""
    lock = out.parent / f".{out.name}.lock"
    found = {json.loads(lock.read_text())["pid"]} if lock.is_file() and lock.read_text() else set()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
                if any(a == "--out" and b == str(out) for a, b in zip(argv, argv[1:])):
                    found.add(int(proc.name))
    return found


def kill_at_checkpoint(out: Path, step: int, timeout: float) -> set[int]:
    """Once the stage writing `out` has written checkpoint `step` (in its staging directory), kill -9 its processes
    (what a lost node takes with it; Airflow's own task supervisor stays, to see the task fail). Returns the killed
    process ids; fails if the stage finished first, or never got there in `timeout` seconds."""
    checkpoint = out.parent / f".{out.name}.partial" / "checkpoints" / f"step-{step:06d}"
    deadline = time.time() + timeout
    while not checkpoint.is_dir():
        assert not out.is_dir(), f"{out} was written before it could be killed"
        assert time.time() < deadline, f"no {checkpoint} in {timeout:.0f} s"
        time.sleep(0.02)
    killed = set()
    for pid in stage_processes(out):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            killed.add(pid)
    assert killed and not out.is_dir(), f"nothing of the stage writing {out} was left to kill"
    return killed
