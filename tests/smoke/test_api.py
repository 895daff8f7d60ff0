"""The Python API (posttrain/api.py): `posttrain.run_stage` runs a stage as `posttrain <stage>` does, and
`posttrain.load_settings` returns the validated settings; `import posttrain` alone loads neither."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys

import pytest

import posttrain
from helpers import REPO, tool_env
from posttrain.errors import UserError


def test_import_posttrain_stays_cheap():
    code = "import sys, posttrain; assert posttrain.__version__; print(sorted(m for m in ('torch', 'posttrain.api', 'posttrain.config') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=tool_env(), cwd=REPO)
    assert result.stdout.strip() == "[]"


def test_load_settings_validates_and_applies_overrides(workdir):
    cfg = posttrain.load_settings(workdir / "params.yaml", ["sft.steps=7"])
    assert cfg.sft.steps == 7
    with pytest.raises(UserError, match="sft.no_such_key"):
        posttrain.load_settings(workdir / "params.yaml", ["sft.no_such_key=1"])


def test_run_stage_data_writes_the_stage_output_and_returns_its_metrics(workdir):
    saved = dict(os.environ)  # MLflow exports MLFLOW_TRACKING_URI; keep it from later subprocesses of this worker
    try:
        with contextlib.chdir(workdir):
            metrics = posttrain.run_stage("data", params="params.yaml")
    finally:
        os.environ.clear()
        os.environ.update(saved)
    out = workdir / "outputs" / "data"
    assert metrics == json.loads((out / "metrics.json").read_text())
    assert metrics["n_train"] == 200 and metrics["n_heldout"] == 40
    assert (out / "train.jsonl").is_file() and not list((workdir / "outputs").glob(".*")), "staging directories left behind"


def test_run_stage_names_an_unknown_stage_in_one_line(workdir):
    with contextlib.chdir(workdir), pytest.raises(UserError):
        posttrain.run_stage("no_such_stage", params="params.yaml")
