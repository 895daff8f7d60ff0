"""CARE's settings section `care` (stage care, recipes/rlhf/dvc.yaml; recipes/rlhf/params.yaml's `care`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from posttrain.config import Section
from posttrain.stages import sections


@sections.register("care", help="stage care: CARE's rubric generator (Context-Adaptive Rubric Evolution), SFT on rubric labels then preference RL")
class CareConfig(Section):  # stage care: CARE's rubric generator (Context-Adaptive Rubric Evolution) for the dialogue task
    label_bias: Literal["none", "turn_blind"] = "turn_blind"  # turn_blind: the SFT rubric labels ignore the turn (the turn-1 row)
    label_noise: float = Field(0.2, ge=0, le=1)  # share of SFT labels with one tenth moved between two dimensions
    n_sft: int = Field(600, gt=0)  # contexts with a rubric label (SFT)
    n_preference: int = Field(2000, gt=0)  # contexts with human preference pairs (preference RL)
    n_heldout: int = Field(300, gt=0)  # held-out contexts: weight error and pair accuracy
    pairs_per_context: int = Field(4, gt=0)
    preference_flip: float = Field(0.1, ge=0, lt=0.5)  # share of human preferences given the wrong way round
    sft_steps: int = Field(300, gt=0)
    batch_size: int = Field(64, gt=0)
    sft_lr: float = Field(0.003, gt=0)
    warmup_steps: int = Field(10, ge=0)
    max_grad_norm: float = Field(1.0, gt=0)  # the SFT phase's gradient-norm clip (preference RL: rl.max_grad_norm)
    rl_steps: int = Field(150, gt=0)  # preference RL with the rl section's objective (advantage, loss, clipping)
    rl_prompts_per_step: int = Field(16, gt=0)
    rl_group_size: int = Field(8, ge=2)  # rubrics sampled per context
    rl_lr: float = Field(0.0005, gt=0)
    format_weight: float = Field(0.1, ge=0)  # reward for a rubric that parses, next to the preference reward q
    log_every: int = Field(10, gt=0)
    checkpoint_every: int = Field(50, ge=0)  # steps between checkpoints, in the SFT and in the RL phase; 0: none
