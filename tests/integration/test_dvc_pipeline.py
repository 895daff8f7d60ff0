"""The whole pipeline through `dvc repro` on a tiny config, in a temporary copy of the repository: every stage runs
once (the session's shared `dvc_repro_run`), then a settings change re-runs only what it affects."""

from __future__ import annotations

import json

import pytest

from helpers import REPRO_STDOUT, copy_repro_run, dvc, ran_stages

pytestmark = pytest.mark.slow


def test_repro_runs_every_stage_then_only_what_changed(dvc_repro_run, tmp_path):
    assert ran_stages((dvc_repro_run / REPRO_STDOUT).read_text()) == {"data", "sft", "rl", "eval@sft", "eval@rl", "distill"}
    repo = copy_repro_run(dvc_repro_run, tmp_path / "repo")  # a copy: the shared run stays read-only
    for name in ("sft", "rl"):
        metrics = json.loads((repo / "outputs" / "eval" / name / "metrics.json").read_text())
        assert 0.0 <= metrics["greedy_accuracy"] <= 1.0 and metrics["n_prompts"] > 0
    assert (repo / "outputs" / "rl" / "model" / "model.safetensors").is_file()
    assert "Data and pipelines are up to date" in dvc("status", cwd=repo)

    params = repo / "params.yaml"
    params.write_text(params.read_text().replace("  lr: 0.0005\n", "  lr: 0.0004\n"))
    second = dvc("repro", cwd=repo)
    assert ran_stages(second) == {"rl", "eval@rl", "distill"}, second  # distill reads the rl settings and model
