"""The upstream outputs of the stages the reliability tests train, built once per session in this process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import MICRO_EDIT, MICRO_IMAGE, built_once, fork_safe_params, posttrain_here


@pytest.fixture(autouse=True)
def _keep_torch_threads():
    """A stage run here sets torch's thread count (pipeline.threads); the tests after it get theirs back."""
    import torch

    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def knowledge_outputs(tmp_path_factory) -> Path:
    """outputs/knowledge on MICRO_EDIT (the edit stage's base model)."""
    def build(root: Path) -> None:
        fork_safe_params(root, edit=MICRO_EDIT)
        posttrain_here("knowledge", cwd=root)

    return built_once(tmp_path_factory, "reliability_knowledge", build) / "outputs"


@pytest.fixture(scope="session")
def image_outputs(tmp_path_factory) -> Path:
    """outputs/city, curate and flow_sft on MICRO_IMAGE (flow_sft's data, flow_rl's data and policy)."""
    def build(root: Path) -> None:
        fork_safe_params(root, **MICRO_IMAGE)
        posttrain_here("city", cwd=root)
        posttrain_here("curate", "--in", "source=outputs/city", cwd=root)
        posttrain_here("flow_sft", "--in", "data=outputs/curate", cwd=root)

    return built_once(tmp_path_factory, "reliability_images", build) / "outputs"


@pytest.fixture(scope="session")
def gold_pairs(pipeline_outputs, tmp_path_factory) -> Path:
    """A pair file with human labels on two thirds of the pairs (ABC-Align's labelled subset), from the task data."""
    rows = [json.loads(line) for line in (pipeline_outputs / "outputs" / "data" / "train.jsonl").read_text().splitlines()][:40]
    path = tmp_path_factory.mktemp("gold_pairs") / "pairs.jsonl"
    labels = [True, False, None]
    off_by_one = [r["completion"][:-1] + str((int(r["completion"][-1]) + 1) % 10) for r in rows]
    path.write_text("".join(
        json.dumps({"prompt": r["prompt"], "chosen": r["completion"], "rejected": wrong, "severity": 0.5, "gold": labels[i % 3]}) + "\n"
        for i, (r, wrong) in enumerate(zip(rows, off_by_one))))
    return path
