"""Shared test set-up: offline, quiet, and a micro config that runs every stage in seconds."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

for key, value in {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "GX_ANALYTICS_ENABLED": "false",
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    "TOKENIZERS_PARALLELISM": "false",
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}.items():
    os.environ[key] = value

from helpers import REPO, CHAT_ARCHS, built_once, dvc, git, micro_params, posttrain, save_chat_checkpoint, tiny_params  # noqa: E402
from helpers import REPRO_STDOUT  # noqa: E402

# CUDA checks run on a GPU machine through `make test-gpu`; `make test` (CPU, CI) does not collect them
collect_ignore = [] if os.environ.get("POSTTRAIN_GPU_TESTS") == "1" else ["gpu"]


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    micro_params(tmp_path)
    return tmp_path


@pytest.fixture(scope="session")
def pipeline_outputs(tmp_path_factory) -> Path:
    """data -> sft -> rl run once on the micro config, shared read-only by tests that need checkpoints."""

    def build(root: Path) -> None:
        micro_params(root)
        for stage in ("data", "sft", "rl"):
            posttrain(stage, cwd=root)

    return built_once(tmp_path_factory, "pipeline", build)


@pytest.fixture(scope="session")
def dvc_repro_run(tmp_path_factory) -> Path:
    """`dvc repro` of the tiny config in a Git-initialised copy of the repository, once per session (read-only: copy
    it to change it). Its stdout is kept in REPRO_STDOUT. Used by the dvc, Kubeflow and sweep tests."""

    def build(root: Path) -> None:
        shutil.copy(REPO / "dvc.yaml", root / "dvc.yaml")
        shutil.copytree(REPO / "src", root / "src", ignore=shutil.ignore_patterns("__pycache__"))
        tiny_params(root)  # wiring, caching and equality across launchers are under test, not learning
        git("init", "-q", cwd=root)  # `dvc exp run` (the sweep test, on a copy) needs a Git repository
        dvc("init", "-q", cwd=root)
        dvc("config", "core.analytics", "false", cwd=root)
        git("add", "-A", cwd=root)
        git("commit", "-qm", "tiny pipeline", cwd=root)
        (root / REPRO_STDOUT).write_text(dvc("repro", cwd=root))

    return built_once(tmp_path_factory, "dvc-repro", build)


@pytest.fixture(scope="session")
def chat_checkpoints(tmp_path_factory) -> dict[str, Path]:
    """Tiny Qwen2 and Llama checkpoints with a BPE tokenizer and a chat template, saved once per session
    (read-only): {arch: directory}."""
    root = built_once(tmp_path_factory, "chat_checkpoints", lambda root: [save_chat_checkpoint(root / a, a) for a in CHAT_ARCHS])
    return {arch: root / arch for arch in CHAT_ARCHS}


# The longest files, longest first (measured with `--durations=0` on 2 cores). The Kubeflow file builds the shared
# dvc_repro_run in its first test, so the other files that use it (test_dvc_sweep, test_dvc_pipeline) come later
# instead of waiting on its lock from the other worker.
LONGEST_FIRST = ("test_kfp_pipeline.py", "test_airflow_servers.py", "test_resume.py", "test_word_problems_example.py",
                 "test_image_stages.py", "test_s3.py", "test_dvc_sweep.py", "test_dvc_pipeline.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest files first, then the other files with slow end-to-end tests, unit tests last. pytest-xdist
    (`--dist loadfile --no-loadscope-reorder`, as `make test` runs it) hands out whole files in this order, so the
    long files start early and the short ones fill in around them, instead of one worker running the last long file
    while the other idles. (Without --no-loadscope-reorder xdist re-sorts files by their number of tests, which puts
    the one-test end-to-end files last.)"""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}

    def rank(item: pytest.Item) -> tuple[int, bool, bool]:
        longest = LONGEST_FIRST.index(item.path.name) if item.path.name in LONGEST_FIRST else len(LONGEST_FIRST)
        return longest, item.path not in slow_files, "unit" in item.path.parts

    items.sort(key=rank)  # stable: the order within each group is kept
    if os.environ.get("POSTTRAIN_HEAVY_TESTS") != "1":  # many minutes each: `make test-heavy`, not `make test`
        heavy = [item for item in items if item.get_closest_marker("heavy")]
        config.hook.pytest_deselected(items=heavy)
        items[:] = [item for item in items if not item.get_closest_marker("heavy")]
