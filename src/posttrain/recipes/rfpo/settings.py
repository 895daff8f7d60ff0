"""RFPO's settings section `critic` (stage critic; recipes/rfpo/params.yaml sets what a run changes). The RL stage of
the recipe reads the core `rl` section under preset `rfpo` (`preset`)."""

from __future__ import annotations

from pydantic import Field

from posttrain.config import Section
from posttrain.stages import sections


@sections.register("critic", help="stage critic (recipes/rfpo/dvc.yaml): RFPO's success critic, a value model pretrained to predict eventual success from prefixes")
class CriticStageConfig(Section):
    """Stage `critic`: RFPO's success critic, pretrained on the SFT policy's verifier-labelled rollouts."""

    n_prompts: int = Field(1000, gt=0)  # training prompts the SFT policy samples (rl.max_new_tokens, rl.temperature)
    samples_per_prompt: int = Field(4, gt=0)  # rollouts per prompt, each labelled 1 / 0 by the task's verifier
    n_heldout_prompts: int = Field(200, gt=0)  # held-out prompts for the calibration figures
    steps: int = Field(600, gt=0)  # every state s_0 .. s_L of a rollout is regressed on its label (squared error)
    batch_size: int = Field(64, gt=0)  # rollouts per step (every state of each is regressed on its label)
    lr: float = Field(0.001, gt=0)
    warmup_steps: int = Field(20, ge=0)
    max_grad_norm: float = Field(1.0, gt=0)
    log_every: int = Field(50, gt=0)
    checkpoint_every: int = Field(100, ge=0)  # 0: no checkpoints
