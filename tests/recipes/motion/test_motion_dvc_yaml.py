"""recipes/motion/dvc.yaml (MotionInsight outside the default `dvc repro`) maps paths and params onto real CLI stages, runs them
from the repository root, consumes only what its own stages produce, and chains data -> SFT -> GRPO."""

from __future__ import annotations

import shlex

from helpers import REPO
from posttrain.stages import stages
from helpers import checked_side_pipeline

MOTION = REPO / "recipes" / "motion" / "dvc.yaml"


def test_motion_commands_inputs_outputs_and_params():
    motion = checked_side_pipeline(MOTION, {"motion_data", "motion_sft", "motion_grpo"})
    for name, stage in motion.items():  # every input named, and --resume exactly where the stage can resume
        argv = shlex.split(stage["cmd"])
        assert {argv[i + 1].split("=")[0] for i, a in enumerate(argv) if a == "--in"} == set(stages.entry(name).meta["inputs"]), name
        assert ("--resume" in argv) == bool(stages.entry(name).meta.get("resumable")), name
    grpo = shlex.split(motion["motion_grpo"]["cmd"])
    assert "sft=outputs/motion_sft" in grpo and "data=outputs/motion_data" in grpo and "outputs/motion_sft/model" in motion["motion_grpo"]["deps"]
