"""recipes/search/dvc.yaml (agentic search RL outside the default `dvc repro`: ASCT and BRIDGE) maps its paths and params onto
the real `asct` and `bridge` CLI stages, run from the repository root, each resumable, reading params files that
exist and extend the repository's; and bridge's world has a trainable retriever (every arm but frozen trains it)."""

from __future__ import annotations

import shlex

import yaml

from helpers import repo_params, REPO
from helpers import checked_side_pipeline

SEARCH = REPO / "recipes" / "search" / "dvc.yaml"


def test_search_commands_outputs_and_params():
    side = checked_side_pipeline(SEARCH, {"asct", "bridge"})
    variables = {k: v for entry in yaml.safe_load(SEARCH.read_text())["vars"] for k, v in entry.items()}
    for name, params in (("asct", "params_file"), ("bridge", "bridge_params")):
        argv = shlex.split(side[name]["cmd"])
        assert "--resume" in argv and argv[argv.index("--params") + 1] == f"${{{params}}}", name
        files = {f for entry in side[name]["params"] for f in entry}
        assert files >= {f"${{{params}}}", "params.yaml"}, name  # the stage's own file and the defaults it extends
    assert variables["params_file"] == "recipes/search/params.yaml" and variables["bridge_params"] == "recipes/search/bridge.yaml"
    asct, bridge = repo_params(REPO / variables["params_file"]), repo_params(REPO / variables["bridge_params"])  # the settings a run gets
    assert asct["task"]["name"] == bridge["task"]["name"] == "search" and asct["task"]["options"]["search"]["retriever"] == "bm25"
    assert bridge["bridge"]["retriever"] == "dual_encoder" and bridge["model"]["path"] is None
