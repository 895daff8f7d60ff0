"""MotionInsight's settings section `motion` (stages motion_data, motion_sft, motion_grpo; recipes/motion/params.yaml sets
what a run changes)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from posttrain.config import Registered, Section
from posttrain.stages import sections


class MotionVideoConfig(Section):  # motion.video: the synthetic clips (recipes/motion/videos.py)
    frames: int = Field(24, ge=8, le=64)  # frames per clip
    size: int = Field(32, ge=16, le=128)  # square canvas, pixels
    objects: int = Field(2, ge=2, le=4)  # moving shapes per clip (identity_swap needs two)
    gravity: float = Field(0.25, gt=0)  # pixels / frame^2
    clean_fraction: float = Field(0.25, ge=0, le=1)  # share of clips with no injected failure cause


class MotionModelConfig(Section):  # motion.model: the evaluator (recipes/motion/evaluator.py)
    pool: int = Field(2, ge=1)  # the encoder reads the maps average-pooled by this factor (video.size a multiple of it)
    encoder_width: int = Field(32, gt=0)  # channels of the per-frame convolutions and the temporal features
    soft_tokens: int = Field(4, gt=0, le=16)  # video tokens prepended to the language model's input
    hidden_size: int = Field(64, gt=0)  # the tiny Llama decoder
    layers: int = Field(2, gt=0)
    heads: int = Field(2, gt=0)


class MotionSFTConfig(Section):  # motion.sft: stage motion_sft
    steps: int = Field(400, gt=0)
    batch_size: int = Field(32, gt=0)
    lr: float = Field(0.002, gt=0)  # AdamW
    max_grad_norm: float = Field(1.0, gt=0)
    log_every: int = Field(25, gt=0)
    checkpoint_every: int = Field(100, ge=0)  # 0: no checkpoints (nothing to resume)


class MotionRLConfig(Section):  # motion.rl: stage motion_grpo, GRPO with MotionInsight's reward (recipes/motion/reward.py)
    advantage: Annotated[str, Registered("advantages", meta="on_rewards", why="needs token-level rollouts (the evaluator has a reward matrix only)")] = "grpo"  # an estimator with a reward-matrix core (objectives: grpo, gdpo, ...)
    loss: Annotated[str, Registered("losses")] = "clip"  # the policy loss (objectives/policy_losses.py)
    loss_agg: Annotated[str, Registered("loss_aggregations")] = "token_mean"
    steps: int = Field(40, gt=0)
    videos_per_step: int = Field(8, gt=0)  # clips per step
    group_size: int = Field(8, ge=2)  # judgements sampled per clip (G)
    max_new_tokens: int = Field(14, ge=8, le=32)  # a judgement is 8-13 words and the end-of-text token
    temperature: float = Field(1.0, gt=0)
    lr: float = Field(0.0005, gt=0)
    max_grad_norm: float = Field(1.0, gt=0)
    clip_eps_low: float = Field(0.2, ge=0)
    clip_eps_high: float = Field(0.2, ge=0)
    epochs_per_batch: int = Field(1, gt=0)  # >1 reuses a rollout batch (the ratio then moves off 1)
    correction: Annotated[str, Registered("corrections")] = "none"  # off-policy correction of the loss (objectives/off_policy.py; docs/async.md)
    dynamic_sampling: bool = False  # DAPO: drop the videos whose judgements all got equal rewards, draw more to refill
    dynamic_sampling_max_rollouts: int = Field(4, ge=0)  # bound on the extra rollouts per step
    std_scaling: Literal["group", "batch", "none"] = "group"  # GRPO's group std (batch | none)
    std_eps: float = Field(0.0001, gt=0)
    beta: float = Field(0.02, ge=0)  # k3 KL to the SFT evaluator; 0 skips the reference
    w_cause: float = Field(0.5, ge=0)  # w_c: weight of the failure-cause F1
    w_format: float = Field(0.1, ge=0)  # w_f: weight of the format term
    log_every: int = Field(1, gt=0)
    checkpoint_every: int = Field(10, ge=0)  # steps between checkpoints: `posttrain motion_grpo --resume`


@sections.register("motion", help="stages motion_data -> motion_sft -> motion_grpo (recipes/motion/dvc.yaml): MotionInsight, a motion-fidelity evaluator (specs §30; docs/motion.md)")
class MotionConfig(Section):  # stages motion_data -> motion_sft -> motion_grpo: MotionInsight (specs §30)
    video: MotionVideoConfig = MotionVideoConfig()  # recipes/motion/videos.py: shapes falling under gravity, some with injected failure causes
    n_train: int = Field(600, gt=0)  # training clips (SFT and GRPO draw from them)
    n_heldout: int = Field(200, ge=2)  # held-out clips: rank correlation per dimension, failure-cause F1
    n_gifs: int = Field(4, ge=0)  # held-out clips written (and logged) as GIFs with their judgements
    representation: Literal["motion", "rgb"] = "motion"  # what the evaluator reads: flow + tracks, or the RGB frames
    track_slots: int = Field(2, gt=0)  # motion: objects tracked (at least video.objects)
    model: MotionModelConfig = MotionModelConfig()  # recipes/motion/evaluator.py: video encoder -> soft tokens -> tiny Llama decoder
    sft: MotionSFTConfig = MotionSFTConfig()  # stage motion_sft: cross-entropy on each training clip's annotated judgement line
    rl: MotionRLConfig = MotionRLConfig()  # stage motion_grpo: GRPO with reward = score accuracy + w_cause F1(causes) + w_format format

    @model_validator(mode="after")
    def _slots(self) -> "MotionConfig":
        if self.track_slots < self.video.objects:
            raise ValueError(f"track_slots ({self.track_slots}) must be at least video.objects ({self.video.objects})")
        if self.video.size % self.model.pool:
            raise ValueError(f"video.size ({self.video.size}) must be a multiple of model.pool ({self.model.pool})")
        return self
