"""The image recipe's settings sections (recipes/image/params.yaml sets what a run changes):

  city: stage city, the synthetic city with known truth (street views + two-epoch satellite tiles)
  curate: stage curate, VIGOR-his pairing, screening, change labels and instructions
  flow: the conditional flow-matching model flow_sft, flow_rl and flow_eval build or load (`flow.kind`: a flow_backends
    entry); its own rule (meta `check`, run by `posttrain.resolve.check`): the backend's meta requirements hold
  flow_sft: stage flow_sft, flow-matching SFT on the curated training quadruplets
  flow_rl: stage flow_rl, Flow-GRPO with the text pipeline's advantage estimators and losses (flow_eval reads its rewards)
  flow_eval: stage flow_eval, IA / BP / QP of the SFT and RL flow models on held-out edits
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from posttrain.config import LoraConfig, Registered, Section
from posttrain.errors import UserError
from posttrain.registry import Registry
from posttrain.stages import sections


def check_flow(flow: FlowModelConfig, registries: dict[str, Registry]) -> None:
    """The `flow` section's rule across the registries: the backend's meta requirements hold (one-line UserError)."""
    meta = registries["flow_backends"].entry(flow.kind).meta
    if (meta.get("needs_checkpoint") and flow.path is None) or (meta.get("needs_lora") and flow.lora.r == 0):
        raise UserError(f"flow: kind {flow.kind} needs flow.path (a checkpoint directory) and flow.lora.r > 0 (only adapters train)")


@sections.register("city", help="synthetic city with known truth (street views + two-epoch satellite tiles)")
class CityConfig(Section):  # the synthetic city (stage `city`), the embedded default source of `curate`
    n_locations: int = Field(300, gt=0)
    n_cities: int = Field(3, ge=1, le=11)
    image_size: int = Field(32, ge=12, multiple_of=4)


@sections.register("curate", help="VIGOR-his pairing, screening, change labels, instructions")
class CurateConfig(Section):  # VIGOR-his curation (the CrossTimeEdit dataset pipeline)
    d_max_m: float = Field(10.0, gt=0)  # pairing radius (haversine)
    min_gap_years: int = Field(5, ge=0)  # newer capture year - older capture year
    tile_radius_m: float = Field(6.0, gt=0)  # satellite tiles farther than this from the recent panorama are not used
    embedder: Annotated[str, Registered("embedders")] = "thumbnail"  # posttrain registry: embedders
    min_similarity: float = Field(0.92, ge=-1, le=1)  # persistent-content cosine similarity
    geometric_check: Annotated[str, Registered("geometric_checks")] = "orb_ransac"  # none skips it
    min_inlier_ratio: float = Field(0.25, ge=0, le=1)  # geometric agreement: RANSAC inliers / keypoints
    min_brightness: float = Field(0.3, ge=0, le=1)  # rejects night captures
    min_sharpness: float = Field(0.027, ge=0)  # rejects motion blur (mean horizontal gradient)
    classifier: Annotated[str, Registered("change_classifiers")] = "satellite_diff"  # posttrain registry: change_classifiers
    min_changed: float = Field(0.02, ge=0, le=1)  # share of satellite pixels whose material changed, below: no_change
    instruction_writer: Annotated[str, Registered("instruction_writers")] = "template"  # posttrain registry: instruction_writers (a VLM hook registers there)
    min_region_share: float = Field(0.5, ge=0, le=1)  # share of the street-level difference inside the edited region
    heldout_fraction: float = Field(0.2, ge=0, lt=1)


@sections.register("flow", help="conditional flow-matching model: UNet2DModel on [x_t, S_new, A_old, A_new] + instruction", check=check_flow)
class FlowModelConfig(Section):  # the conditional flow-matching image model
    kind: Annotated[str, Registered("flow_backends")] = "unet"  # unet: the tiny UNet; flux: a diffusers FLUX checkpoint + LoRA
    path: str | None = None  # unet: a saved flow model directory or None (tiny new one); flux: the checkpoint directory
    flux_guidance: float = Field(2.5, ge=0)  # flux: the distilled guidance value fed to a transformer with guidance embeddings
    image_size: int = Field(16, ge=8, multiple_of=4)  # the model's resolution; curated images are area-averaged down to it
    block_channels: tuple[int, ...] = (16, 32)
    layers_per_block: int = Field(1, gt=0)
    norm_groups: int = Field(8, gt=0)
    text_dim: int = Field(128, gt=0)  # hashed bag-of-words size of the instruction encoder
    lora: LoraConfig = LoraConfig(target_modules=("to_q", "to_k", "to_v", "conv1", "conv2"))

    @field_validator("path")
    @classmethod
    def _path_exists(cls, v: str | None) -> str | None:
        if v is not None and not Path(v).is_dir():
            raise ValueError(f"flow model directory not found: {v}")
        return v

    @model_validator(mode="after")
    def _groups_divide(self) -> "FlowModelConfig":
        bad = [c for c in self.block_channels if c % self.norm_groups]
        if not self.block_channels or bad:
            raise ValueError(f"block_channels {list(self.block_channels)} must be non-empty multiples of norm_groups {self.norm_groups}")
        return self


@sections.register("flow_sft", help="stage flow_sft: flow-matching SFT of the conditional image model on the curated training quadruplets")
class FlowSFTConfig(Section):
    steps: int = Field(600, gt=0)
    batch_size: int = Field(32, gt=0)
    lr: float = Field(0.002, gt=0)
    warmup_steps: int = Field(20, ge=0)
    max_grad_norm: float = Field(1.0, gt=0)
    log_every: int = Field(20, gt=0)
    checkpoint_every: int = Field(100, ge=0)  # 0: no checkpoints (--resume then starts over)


class ImageRewardSpec(Section):
    name: Annotated[str, Registered("image_rewards")]
    weight: float = Field(ge=0)


@sections.register("flow_rl", help="Flow-GRPO: SDE sampling, per-step clipped ratio, closed-form Gaussian KL")
class FlowRLConfig(Section):  # Flow-GRPO (arXiv 2505.05470) with the text pipeline's advantage estimators and losses
    advantage: Annotated[str, Registered("advantages", meta="on_rewards", why="needs token-level rollouts (images have a reward matrix only)")] = "gdpo"  # gdpo | sum_then_normalize | grpo (estimators that work on the reward matrix)
    loss: Annotated[str, Registered("losses")] = "clip"  # applied per denoising step
    loss_agg: Annotated[str, Registered("loss_aggregations")] = "token_mean"  # over (image, denoising step)
    rewards: tuple[ImageRewardSpec, ...] = ({"name": "ia", "weight": 1.0}, {"name": "bp", "weight": 1.0}, {"name": "qp", "weight": 1.0})
    steps: int = Field(40, gt=0)
    prompts_per_step: int = Field(4, gt=0)
    group_size: int = Field(8, ge=2)
    sampling_steps: int = Field(10, ge=2)
    timestep_fraction: float = Field(0.6, gt=0, le=1)  # the first int(fraction * sampling_steps) steps are SDE steps, trained on
    noise_level: float = Field(0.7, ge=0)
    clip_eps_low: float = Field(0.0001, ge=0)
    clip_eps_high: float = Field(0.0001, ge=0)
    adv_clip_max: float = Field(5.0, gt=0)
    std_scaling: Literal["group", "batch", "none"] = "group"
    std_eps: float = Field(0.0001, gt=0)
    beta: float = Field(0.0, ge=0)  # closed-form Gaussian KL to the SFT model; 0 skips the reference
    lr: float = Field(0.0001, gt=0)  # full fine-tuning of the tiny model; 3e-4 (the LoRA setting) drifts with 4 prompts a step
    max_grad_norm: float = Field(1.0, gt=0)
    epochs_per_batch: int = Field(1, gt=0)  # optimizer steps per sampled batch (Flow-GRPO's num_inner_epochs); >1: ratio != 1
    micro_batch: int = Field(0, ge=0)  # > 0: chains per forward/backward pass (the whole batch's gradient, one micro-batch's activations)
    dynamic_sampling: bool = False  # DAPO: drop edits whose images all score alike (no advantage), sample more edits to refill
    dynamic_sampling_max_rollouts: int = Field(4, ge=0)  # bound on the extra rollouts per step
    log_every: int = Field(1, gt=0)
    checkpoint_every: int = Field(10, ge=0)  # 0: no checkpoints (flow_rl --resume then starts over)

    @field_validator("rewards")
    @classmethod
    def _some_image_rewards(cls, v: tuple[ImageRewardSpec, ...]) -> tuple[ImageRewardSpec, ...]:
        names = [r.name for r in v]
        if not v or len(set(names)) != len(names):
            raise ValueError(f"needs at least one reward, each listed once: {names}")
        return v


@sections.register("flow_eval", help="stage flow_eval: IA / BP / QP of the SFT and RL flow models on held-out edits")
class FlowEvalConfig(Section):
    sampling_steps: int = Field(10, ge=2)
    n_prompts: int = Field(64, gt=0)  # held-out quadruplets scored (at most all of them)
    samples_per_prompt: int = Field(2, gt=0)
    n_grid: int = Field(8, ge=0)  # rows in the logged source / target / generated grid

