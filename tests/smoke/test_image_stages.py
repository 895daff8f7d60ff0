"""The image pipeline's stages through the CLI on a micro config: city -> curate -> flow_sft -> flow_rl ->
flow_eval (the saved-model + LoRA path is tests/unit/test_flow_model.py). Their bad inputs (a corrupt or incomplete
panorama table, damaged curated data or flow models) are cases of tests/reliability/test_bad_inputs.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import MICRO_IMAGE, micro_params, posttrain_here


@pytest.fixture(scope="module")
def image_run(tmp_path_factory) -> Path:
    """The five stages through the CLI's commands in this process (a subprocess each would spend most of its time
    importing torch and diffusers; the installed entry point is exercised by the text pipeline's tests)."""
    root = tmp_path_factory.mktemp("images")
    micro_params(root, **MICRO_IMAGE)
    posttrain_here("city", "--out", "out/city", cwd=root)
    posttrain_here("curate", "--in", "source=out/city", "--out", "out/curate", cwd=root)
    posttrain_here("flow_sft", "--in", "data=out/curate", "--out", "out/flow_sft", cwd=root)
    posttrain_here("flow_rl", "--in", "data=out/curate", "--in", "policy=out/flow_sft", "--out", "out/flow_rl", cwd=root)
    posttrain_here("flow_eval", "--in", "data=out/curate", "--in", "sft=out/flow_sft", "--in", "rl=out/flow_rl", "--out", "out/flow_eval", cwd=root)
    return root


def metrics(path: Path) -> dict:
    return json.loads((path / "metrics.json").read_text())


def test_every_stage_writes_its_outputs(image_run):
    out = image_run / "out"
    curate = metrics(out / "curate")
    assert curate["n_quadruplets"] > 10 and curate["pairing_precision"] > 0.8 and curate["pairing_recall"] > 0.8
    assert curate["panoramas_per_second"] > 0
    assert json.loads((out / "curate" / "validation.json").read_text())["success"]
    report = json.loads((out / "curate" / "report.json").read_text())
    assert report["counts"]["total"]["total"] == curate["n_quadruplets"]
    assert (out / "flow_sft" / "model" / "unet" / "config.json").is_file()
    assert len(json.loads((out / "flow_rl" / "history.json").read_text())) == 2
    assert not (out / "flow_rl" / "checkpoints").exists()  # checkpoints live in the staging directory only
    ev = metrics(out / "flow_eval")
    for model in ("sft", "rl"):
        assert 0 <= ev[f"{model}_overall"] <= 1
        assert ev[f"{model}_overall"] == pytest.approx((ev[f"{model}_ia"] + ev[f"{model}_bp"] + ev[f"{model}_qp"]) / 3)
    assert (out / "flow_eval" / "samples.png").is_file()


def test_images_are_logged_to_mlflow(image_run):
    artifacts = {p.name for p in (image_run / "mlartifacts").rglob("*.png")}
    assert {"samples.png", "reward_curve.png"} <= artifacts

