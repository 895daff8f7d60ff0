"""The image pipeline on a micro config, `dvc repro recipes/image/dvc.yaml`: city -> curate -> flow_sft -> flow_rl -> flow_eval
(the saved-model + LoRA path is tests/recipes/image/test_flow_model.py), and the compiled Kubeflow pipeline `image.yaml` run
locally on the same config, which must give the same metrics and weights. Their bad inputs (a corrupt or
incomplete panorama table, damaged curated data or flow models) are cases of tests/reliability/test_bad_inputs.py."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import pytest

from helpers import MICRO_IMAGE, REPO, WALL_CLOCK, dvc, git, micro_params, ran_stages, tool_env

STAGES = ("city", "curate", "flow_sft", "flow_rl", "flow_eval")
# one torch thread in both launchers (recipes/image/dvc.yaml sets it): the same reductions, so the same weights
SETTINGS = {**MICRO_IMAGE, "pipeline": {"threads": 1}}


@pytest.fixture(scope="module")
def image_run(tmp_path_factory) -> Path:
    """`dvc repro recipes/image/dvc.yaml` of the micro config in a Git- and DVC-initialised copy of the repository."""
    root = tmp_path_factory.mktemp("images")
    (root / "recipes" / "image").mkdir(parents=True)
    for name in ("dvc.yaml", "params.yaml"):  # the recipe's params file extends the micro params.yaml written below
        shutil.copy(REPO / "recipes" / "image" / name, root / "recipes" / "image" / name)
    shutil.copytree(REPO / "src", root / "src", ignore=shutil.ignore_patterns("__pycache__"))
    micro_params(root, **SETTINGS)
    git("init", "-q", cwd=root)
    dvc("init", "-q", cwd=root)
    dvc("config", "core.analytics", "false", cwd=root)
    assert ran_stages(dvc("repro", "recipes/image/dvc.yaml", cwd=root)) == {f"recipes/image/dvc.yaml:{s}" for s in STAGES}
    (root / "out").symlink_to(root / "outputs" / "images")
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



def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_the_compiled_image_pipeline_run_locally_matches_dvc_repro(image_run, tmp_path):
    sys.path.insert(0, str(REPO / "tests" / "orchestration"))
    from kfp_local import LocalPipeline

    from posttrain.orchestration.submit import run_arguments

    package = REPO / "pipelines" / "compiled" / "image.yaml"
    params = micro_params(tmp_path, **SETTINGS)
    pipeline = LocalPipeline.load(package, tmp_path / "kfp", tool_env())
    states = pipeline.run(run_arguments(params, [], package, image=""))
    failed = [r for r in pipeline.runs if r.returncode]
    assert not failed, failed[0].stderr[-3000:]
    assert set(states.values()) == {"SUCCEEDED"}, states
    for stage in STAGES:
        kfp_out = pipeline.task_dir(f"exit-handler-1/posttrain-{stage.replace('_', '-')}") / "artifacts" / "out"
        dvc_out = image_run / "out" / stage
        ours, theirs = (json.loads((d / "metrics.json").read_text()) for d in (kfp_out, dvc_out))
        assert {k: v for k, v in ours.items() if k not in WALL_CLOCK} == {k: v for k, v in theirs.items() if k not in WALL_CLOCK}, stage
        weights = sorted(p.relative_to(dvc_out) for p in dvc_out.glob("model/**/*.safetensors"))
        assert [_digest(kfp_out / w) for w in weights] == [_digest(dvc_out / w) for w in weights], stage
    assert sorted(image_run.glob("out/*/model/**/*.safetensors"))  # there were weights to compare
