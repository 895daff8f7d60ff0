"""A real Airflow on loopback for the tests: `airflow api-server` (127.0.0.1), `scheduler` and `dag-processor` with a
temporary AIRFLOW_HOME, driven through the REST API the UI's Trigger button uses, stopped by process id."""

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
from pathlib import Path

from orch_helpers import BIN, tool_env

from helpers import REPO, free_port

DAGS = REPO / "dags"
FINISHED = {"success", "failed"}


def airflow_env(home: Path, **extra: str) -> dict[str, str]:
    return tool_env(
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__DAGS_FOLDER=str(DAGS),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home / 'airflow.db'}",
        POSTTRAIN_RUNS_DIR=str(home / "runs"),
        POSTTRAIN_AIRFLOW_RETRIES="0",  # a failing stage fails the run at once (retries wait a minute)
        **extra,
    )


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
            with urllib.request.urlopen(request, timeout=30) as response:
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
            _, run = self.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")
            if run.get("state") in FINISHED:
                return run["state"]
            self.check_alive()
            time.sleep(2)
        raise AssertionError(f"{dag_id} run {run_id} did not finish in {timeout:.0f} s: {self.task_states(dag_id, run_id)}\n{self.logs()}")

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str]:
        _, found = self.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances?limit=100")
        return {t["task_id"] + (f"[{t['map_index']}]" if t.get("map_index", -1) >= 0 else ""): t["state"] for t in found.get("task_instances", [])}

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
def airflow_servers(home: Path, dag_ids: tuple[str, ...], timeout: float = 240, env: dict[str, str] | None = None) -> Iterator[Airflow]:
    """api-server, scheduler and dag-processor on a fresh metadata DB (`env`: more variables for them and their tasks);
    yields once `dag_ids` are parsed and unpaused."""
    port = free_port()
    env = airflow_env(
        home,
        **(env or {}),
        AIRFLOW__CORE__PARALLELISM="2",
        AIRFLOW__CORE__EXECUTION_API_SERVER_URL=f"http://127.0.0.1:{port}/execution/",
        AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION="False",
        AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC="2",
        AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL="5",
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS="admin:admin",
        AIRFLOW__API__BASE_URL=f"http://127.0.0.1:{port}",
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
