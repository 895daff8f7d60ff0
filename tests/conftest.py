"""Shared test set-up: offline, quiet, and a micro config that runs every stage in seconds."""

from __future__ import annotations

import os
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

from helpers import CHAT_ARCHS, built_once, micro_params, posttrain, save_chat_checkpoint  # noqa: E402

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
def chat_checkpoints(tmp_path_factory) -> dict[str, Path]:
    """Tiny Qwen2 and Llama checkpoints with a BPE tokenizer and a chat template, saved once per session
    (read-only): {arch: directory}."""
    root = built_once(tmp_path_factory, "chat_checkpoints", lambda root: [save_chat_checkpoint(root / a, a) for a in CHAT_ARCHS])
    return {arch: root / arch for arch in CHAT_ARCHS}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files with slow end-to-end tests first, unit tests last. pytest-xdist (`--dist loadfile`) hands out whole
    files in collection order, so the long files start early and the short ones fill in around them, instead of
    one worker running the last long file while the other idles."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    # stable sort: the order within each group is kept
    items.sort(key=lambda item: (item.path not in slow_files, "unit" in item.path.parts))
