"""recipes/viskg/dvc.yaml (VisKG outside the default `dvc repro`) maps paths and params onto real CLI stages, runs them from
the repository root, consumes only what its own stages produce, and feeds the SFT model to viskg_rl."""

from __future__ import annotations

import shlex

from helpers import REPO
from helpers import checked_side_pipeline

VISKG = REPO / "recipes" / "viskg" / "dvc.yaml"


def test_viskg_commands_inputs_outputs_and_params():
    viskg = checked_side_pipeline(VISKG, {"viskg_sft", "viskg_rl"})
    assert all("--resume" in shlex.split(stage["cmd"]) for stage in viskg.values())
    assert "model=outputs/viskg_sft" in shlex.split(viskg["viskg_rl"]["cmd"]) and "outputs/viskg_sft/model" in viskg["viskg_rl"]["deps"]
