"""One `dvc repro` of the tiny config, shared by the orchestration tests (each pipeline run costs tens of seconds)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from orch_helpers import dvc, git, tiny_params

from helpers import REPO, built_once


@pytest.fixture(scope="session")
def dvc_repro_run(tmp_path_factory) -> Path:
    """`dvc repro` of the tiny config in a copy of the repository."""

    def build(root: Path) -> None:
        shutil.copy(REPO / "dvc.yaml", root / "dvc.yaml")
        shutil.copytree(REPO / "src", root / "src", ignore=shutil.ignore_patterns("__pycache__"))
        tiny_params(root)
        git("init", "-q", cwd=root)  # `dvc exp run` (the sweep test, on a copy) needs a Git repository
        dvc("init", "-q", cwd=root)
        dvc("config", "core.analytics", "false", cwd=root)
        git("add", "-A", cwd=root)
        git("commit", "-qm", "tiny pipeline", cwd=root)
        dvc("repro", cwd=root)

    return built_once(tmp_path_factory, "dvc-repro", build)
