"""Helpers shared by the smoke, integration and orchestration tests."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
POSTTRAIN = str(Path(sys.executable).with_name("posttrain"))

MICRO = {
    "task": {"n_train": 200, "n_heldout": 40},
    "model": {"hidden_size": 32, "intermediate_size": 64, "layers": 1},
    "sft": {"steps": 30, "batch_size": 32, "n_examples": 0, "log_every": 10, "warmup_steps": 2},
    "rl": {"steps": 4, "prompts_per_step": 4, "group_size": 4, "checkpoint_every": 2, "warmup_steps": 0},
    "eval": {"n_prompts": 40, "batch_size": 40, "n_table": 5},
    "distill": {"steps": 2, "prompts_per_step": 4},
}


# smaller than MICRO still: these tests check wiring and equality across launchers, not learning
TINY = {
    "task": {"n_train": 120, "n_heldout": 20},
    "sft": {"steps": 10, "batch_size": 16, "n_examples": 0, "log_every": 5, "warmup_steps": 1},
    "rl": {"steps": 2, "prompts_per_step": 2, "group_size": 2, "checkpoint_every": 1, "warmup_steps": 0},
    "eval": {"n_prompts": 20, "batch_size": 20, "n_table": 2},
    "distill": {"steps": 2, "prompts_per_step": 2},
}
def micro_params(directory: Path, **sections: dict) -> Path:
    """Write the repo's params.yaml, shrunk to micro sizes (plus `sections` overrides), into `directory`."""
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    for name, values in [*MICRO.items(), *sections.items()]:
        params[name] = {**params[name], **values}
    params["tracking"]["uri"] = f"sqlite:///{directory / 'mlflow.db'}"
    params["tracking"]["artifact_root"] = str(directory / "mlartifacts")
    path = directory / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


def tiny_params(directory: Path, **sections: dict) -> Path:
    return micro_params(directory, **{**TINY, **sections})


def posttrain(*args: str, cwd: Path, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the installed `posttrain` CLI as a user would."""
    result = subprocess.run([POSTTRAIN, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"posttrain {' '.join(args)} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return result


def posttrain_in_process(*args: str) -> str:
    """The `posttrain` CLI in this process (a subprocess spends seconds importing torch per call); its output."""
    from typer.testing import CliRunner

    from posttrain.cli import _register_stage_commands, app

    _register_stage_commands()
    result = CliRunner().invoke(app, list(args), standalone_mode=False)
    assert result.exit_code == 0 and result.exception is None, (result.output, result.exception)
    return result.output


def copy_outputs(source: Path, target: Path) -> None:
    shutil.copytree(source / "outputs", target / "outputs")


def built_once(tmp_path_factory, name: str, build: Callable[[Path], None]) -> Path:
    """A read-only directory that `build` fills once per test session, shared by every pytest-xdist worker
    (the workers' temp dirs share a parent; a file lock makes the first worker build and the others wait)."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        root = tmp_path_factory.mktemp(name)
        build(root)
        return root
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp().parent
    root, done = shared / name, shared / f"{name}.done"
    with FileLock(str(shared / f"{name}.lock")):
        if not done.exists():
            shutil.rmtree(root, ignore_errors=True)  # a worker that failed half-way left this
            root.mkdir()
            build(root)
            done.touch()
    return root


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def moto_server(*buckets: str) -> Iterator[tuple[str, subprocess.Popen]]:
    """A loopback S3 stand-in (moto) on 127.0.0.1 with `buckets`, started here and stopped by its process id;
    yields its endpoint and its process (tests freeze it with SIGSTOP)."""
    port = free_port()
    server = subprocess.Popen([str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        import boto3

        for bucket in buckets:
            boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
        yield endpoint, server
    finally:
        os.killpg(server.pid, signal.SIGCONT)  # a frozen server cannot act on SIGTERM
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
