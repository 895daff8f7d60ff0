"""recipes/dsp/dvc.yaml (DSP outside the default `dvc repro`) maps paths and params onto real CLI stages, runs them from the
repository root, consumes only what its own stages produce, and feeds the maze data to dsp."""

from __future__ import annotations

import shlex

from helpers import REPO
from helpers import checked_side_pipeline

DSP = REPO / "recipes" / "dsp" / "dvc.yaml"


def test_dsp_commands_inputs_outputs_and_params():
    dsp = checked_side_pipeline(DSP, {"maze_data", "dsp"})
    cmd = shlex.split(dsp["dsp"]["cmd"])
    assert "data=outputs/maze_data" in cmd and "--resume" in cmd and "outputs/maze_data/dataset.npz" in dsp["dsp"]["deps"]
