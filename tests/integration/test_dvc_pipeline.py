"""The whole pipeline through `dvc repro` on a micro config, in a temporary copy of the repository."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO, tiny_params

pytestmark = pytest.mark.slow


def dvc(*args: str, cwd: Path) -> str:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    result = subprocess.run([str(Path(sys.executable).with_name("dvc")), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


@pytest.fixture(scope="module")
def repo_copy(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    shutil.copy(REPO / "dvc.yaml", root / "dvc.yaml")
    shutil.copytree(REPO / "src", root / "src", ignore=shutil.ignore_patterns("__pycache__"))
    tiny_params(root)  # wiring and caching are under test here, not learning
    dvc("init", "--no-scm", "-q", cwd=root)
    dvc("config", "core.analytics", "false", cwd=root)
    return root


def ran_stages(output: str) -> set[str]:
    return {line.split("'")[1] for line in output.splitlines() if line.startswith("Running stage")}


def test_repro_runs_every_stage_then_only_what_changed(repo_copy):
    first = dvc("repro", cwd=repo_copy)
    assert ran_stages(first) == {"data", "sft", "rl", "eval@sft", "eval@rl", "distill"}
    for name in ("sft", "rl"):
        metrics = json.loads((repo_copy / "outputs" / "eval" / name / "metrics.json").read_text())
        assert 0.0 <= metrics["greedy_accuracy"] <= 1.0
    assert (repo_copy / "outputs" / "rl" / "model" / "model.safetensors").is_file()
    assert "Data and pipelines are up to date" in dvc("status", cwd=repo_copy)

    params = repo_copy / "params.yaml"
    params.write_text(params.read_text().replace("  lr: 0.0005\n", "  lr: 0.0004\n"))
    second = dvc("repro", cwd=repo_copy)
    assert ran_stages(second) == {"rl", "eval@rl", "distill"}, second  # distill reads the rl settings and model
