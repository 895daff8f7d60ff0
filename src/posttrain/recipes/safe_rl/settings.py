"""VLM-Safe-RL's settings section `safe_rl` (stages drive_encoder + safe_rl; recipes/safe_rl/params.yaml sets what a run changes)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from posttrain.config import Section
from posttrain.stages import sections


class DrivingEnvConfig(Section):  # safe_rl.env: the driving environment (recipes/safe_rl/driving.py)
    lanes: int = Field(3, ge=2, le=6)
    cars: int = Field(5, ge=1)  # other cars around the ego car (one hit, or left behind, is respawned ahead)
    horizon: int = Field(48, ge=2)  # steps per episode (the time left is a state feature)
    image_size: int = Field(32, ge=16, multiple_of=8)  # camera frames are image_size x image_size RGB
    speed_min: float = Field(0.2, gt=0)  # road units per step
    speed_max: float = Field(1.0, gt=0)
    speed_step: float = Field(0.1, gt=0)  # speed change of a speed-up / slow-down action
    steer_step: float = Field(0.25, gt=0)  # lateral move of a steer action (a lane is 1 wide)
    traffic_speed: tuple[float, float] = (0.2, 0.5)  # other cars' speeds, uniform in [low, high]
    danger_ttc: float = Field(4.0, gt=0)  # captions: "about to crash" when a car in the ego lane is reached within this many steps
    edge_margin: float = Field(0.15, ge=0)  # captions: "about to leave the road" within this distance of the edge

    @model_validator(mode="after")
    def _ranges(self) -> "DrivingEnvConfig":
        low, high = self.traffic_speed
        if not (self.speed_min < self.speed_max and 0 <= low <= high):
            raise ValueError("needs speed_min < speed_max and 0 <= traffic_speed[0] <= traffic_speed[1]")
        return self


class DriveEncoderConfig(Section):  # safe_rl.encoder: stage drive_encoder, a tiny CLIP trained by InfoNCE on the env's frames
    n_frames: int = Field(6000, gt=0)  # training frames (a random driver's episodes), each with its state's caption phrases
    n_heldout: int = Field(600, gt=1)  # held-out frames: retrieval accuracy and the safe / danger score gap
    steps: int = Field(400, gt=0)
    batch_size: int = Field(128, ge=2)
    lr: float = Field(0.002, gt=0)
    warmup_steps: int = Field(20, ge=0)
    max_grad_norm: float = Field(1.0, gt=0)
    hidden_size: int = Field(32, gt=0)  # both towers
    layers: int = Field(2, gt=0)
    heads: int = Field(2, gt=0)
    patch_size: int = Field(8, gt=0)
    embed_dim: int = Field(32, gt=0)  # the shared image-text embedding
    log_every: int = Field(50, gt=0)
    checkpoint_every: int = Field(100, ge=0)  # 0: no checkpoints (nothing to resume)


@sections.register("safe_rl", help="stages drive_encoder + safe_rl (recipes/safe_rl/dvc.yaml): VLM-Safe-RL, PPO-Lagrangian in the driving environment (specs §16; docs/safe_rl.md)")
class SafeRLConfig(Section):  # stages drive_encoder + safe_rl: VLM-Safe-RL (specs §16), PPO-Lagrangian in the driving env
    env: DrivingEnvConfig = DrivingEnvConfig()  # recipes/safe_rl/driving.py: a straight multi-lane road with traffic, seen by a camera above the ego car
    encoder: DriveEncoderConfig = DriveEncoderConfig()  # stage drive_encoder: a tiny CLIP (transformers CLIPModel) trained by InfoNCE on frames + captions
    safe_prompt: str = Field("a car driving safely on a clear road", min_length=1)  # T_safe
    danger_prompt: str = Field("a car about to crash into another vehicle", min_length=1)  # T_danger
    iterations: int = Field(40, gt=0)  # rollout + update rounds; the multiplier moves once per round
    envs: int = Field(16, gt=0)  # episodes per round
    epochs: int = Field(4, gt=0)  # passes over a round's steps
    minibatches: int = Field(4, gt=0)
    lr: float = Field(0.003, gt=0)  # Adam, policy and both critics
    hidden_size: int = Field(64, gt=0)  # policy and both critics: MLPs over [image embedding, state features]
    gamma: float = Field(0.99, ge=0, le=1)
    gae_lambda: float = Field(0.95, ge=0, le=1)  # GAE (objectives/gae.py) for the shaped reward and for the cost, each with its critic
    clip_eps: float = Field(0.2, gt=0)  # PPO ratio clip
    value_clip: float = Field(10.0, gt=0)  # clipped value loss (objectives/value_loss.py) of both critics (returns reach ~30: a loose clip)
    entropy_coef: float = Field(0.01, ge=0)
    max_grad_norm: float = Field(0.5, gt=0)
    lagrangian: bool = True  # false: plain PPO (lambda stays lambda_init; costs are logged only)
    lambda_init: float = Field(0.0, ge=0)
    lambda_lr: float = Field(0.05, ge=0)  # eta_l
    cost_limit: float = Field(1.0, ge=0)  # d
    cost_measure: Literal["episodic", "progress"] = "progress"  # J_C in the multiplier update: sum_t c_t, or sum_t c_t / max(progress, p_min)
    p_min: float = Field(0.1, gt=0, le=1)  # floor of the progress that normalises the cost
    alpha_clip: float = Field(0.1, ge=0)  # reward shaping weight of the VLM safety score
    kappa: float = Field(0.1, ge=0)  # weight of the VLM risk term in the multiplier update
    risk_threshold: float = -0.3  # s_thr: the allowed mean VLM risk (-s)
    eval_episodes: int = Field(32, gt=0)  # greedy episodes after training (catastrophe rate, cost, progress; one as a GIF)
    log_every: int = Field(1, gt=0)
    checkpoint_every: int = Field(10, ge=0)  # rounds between checkpoints: `posttrain safe_rl --resume`; 0: none
