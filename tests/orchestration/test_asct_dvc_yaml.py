"""asct/dvc.yaml (ASCT outside the default `dvc repro`) maps its paths and params onto the real `asct` CLI stage, run
from the repository root, and depends on files that exist."""

from __future__ import annotations

import shlex

import yaml

from helpers import REPO
from posttrain.config import Config
from posttrain.stages import stages
from test_dvc_yaml import expanded_stages


def test_asct_command_outputs_and_params():
    root, asct = expanded_stages(), expanded_stages(REPO / "asct" / "dvc.yaml")
    assert set(asct) == {"asct"} and "asct" not in root
    stage = asct["asct"]
    argv = shlex.split(stage["cmd"])
    assert stage["wdir"] == ".." and argv[:2] == ["posttrain", "asct"] and "asct" in stages and "--resume" in argv
    assert argv[argv.index("--launcher") + 1] == "dvc" and argv[argv.index("--params") + 1] == "${params_file}"
    variables = {k: v for entry in yaml.safe_load((REPO / "asct" / "dvc.yaml").read_text())["vars"] for k, v in entry.items()}
    assert variables["params_file"] == "asct/params.yaml" and (REPO / variables["params_file"]).is_file()
    out = argv[argv.index("--out") + 1]
    assert all(o.startswith(out + "/") for o in stage["outs"])
    files = {f: keys for entry in stage["params"] for f, keys in entry.items()}
    assert set(files) == {"${params_file}", "params.yaml"} and all(k in Config.model_fields for keys in files.values() for k in keys)
    assert all((REPO / dep).exists() for dep in stage["deps"])
