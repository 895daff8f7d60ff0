"""The whole pipeline through `dvc repro` on a micro config, in a temporary copy of the repository."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO, micro_params

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
    micro_params(root)
    git("init", "-q", cwd=root)
    dvc("init", "-q", cwd=root)
    dvc("config", "core.analytics", "false", cwd=root)
    commit(root, "micro pipeline")
    return root


def git(*args: str, cwd: Path) -> None:
    ident = ["-c", "user.name=posttrain-tests", "-c", "user.email=tests@localhost", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", *ident, *args], cwd=cwd, check=True, capture_output=True)


def commit(root: Path, message: str) -> None:
    git("add", "-A", cwd=root)
    git("commit", "-q", "-m", message, cwd=root)


def ran_stages(output: str) -> set[str]:
    return {line.split("'")[1] for line in output.splitlines() if line.startswith("Running stage")}


def test_repro_runs_every_stage_then_only_what_changed(repo_copy):
    first = dvc("repro", cwd=repo_copy)
    assert ran_stages(first) == {"data", "sft", "rl", "eval@sft", "eval@rl"}
    for name in ("sft", "rl"):
        metrics = json.loads((repo_copy / "outputs" / "eval" / name / "metrics.json").read_text())
        assert 0.0 <= metrics["greedy_accuracy"] <= 1.0
    assert (repo_copy / "outputs" / "rl" / "model" / "model.safetensors").is_file()
    assert "Data and pipelines are up to date" in dvc("status", cwd=repo_copy)

    params = repo_copy / "params.yaml"
    params.write_text(params.read_text().replace("  lr: 0.0005\n", "  lr: 0.0004\n"))
    second = dvc("repro", cwd=repo_copy)
    assert ran_stages(second) == {"rl", "eval@rl"}, second

    # every method is a one-line switch of an experiment: `dvc exp run -S` re-runs only rl and eval@rl
    commit(repo_copy, "lock after repro")
    exp = dvc("exp", "run", "-n", "rloo-cispo", "-S", "rl.advantage=rloo", "-S", "rl.loss=cispo", cwd=repo_copy)
    assert ran_stages(exp) == {"rl", "eval@rl"}, exp
    shown = json.loads(dvc("exp", "show", "--json", cwd=repo_copy))
    experiments = [e for commit_ in shown for e in (commit_.get("experiments") or [])]
    [ours] = [e for e in experiments if e.get("name") == "rloo-cispo"]
    data = ours["revs"][0]["data"]
    rl_params = data["params"]["params.yaml"]["data"]["rl"]
    assert (rl_params["advantage"], rl_params["loss"]) == ("rloo", "cispo")
    assert 0.0 <= data["metrics"]["outputs/eval/rl/metrics.json"]["data"]["greedy_accuracy"] <= 1.0
