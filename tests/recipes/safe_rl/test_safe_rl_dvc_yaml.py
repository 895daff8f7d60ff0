"""recipes/safe_rl/dvc.yaml (VLM-Safe-RL outside the default `dvc repro`) maps paths and params onto real CLI stages, runs them
from the repository root, consumes only what its own stages produce, and feeds the trained encoder to safe_rl."""

from __future__ import annotations

import shlex

from helpers import REPO
from helpers import checked_side_pipeline

SAFE_RL = REPO / "recipes" / "safe_rl" / "dvc.yaml"


def test_safe_rl_commands_inputs_outputs_and_params():
    safe = checked_side_pipeline(SAFE_RL, {"drive_encoder", "safe_rl"})
    rl = shlex.split(safe["safe_rl"]["cmd"])
    assert "encoder=outputs/drive_encoder" in rl and "--resume" in rl and "outputs/drive_encoder/model" in safe["safe_rl"]["deps"]
