"""Fixtures of the orchestration tests: the session's shared MLflow tracking server (tracking_server.py)."""

from __future__ import annotations

import os

import pytest
from tracking_server import TrackingServer, start_shared, stop_shared


@pytest.fixture(scope="session")
def tracking_server_starting(tmp_path_factory, request) -> TrackingServer:
    """The shared server (PostgreSQL backend store, moto S3 artifacts), started but perhaps not ready: its address is
    known at once, so a test can set up its clients (an Airflow) meanwhile and `.wait()` before logging. Under
    pytest-xdist every worker gets the same server; it ends with the session (the controller process)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER") is not None
    shared = tmp_path_factory.getbasetemp().parent if worker else tmp_path_factory.getbasetemp()
    from filelock import FileLock

    with FileLock(str(shared / "tracking-server.lock")):
        server = start_shared(shared / "tracking-server", os.getppid() if worker else os.getpid())
    if not worker:
        request.addfinalizer(lambda: stop_shared(server))
    return server


@pytest.fixture(scope="session")
def tracking_server(tracking_server_starting) -> TrackingServer:
    """The shared server, ready."""
    return tracking_server_starting.wait()
