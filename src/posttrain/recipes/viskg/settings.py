"""VisKG's settings section `viskg` (stages viskg_sft + viskg_rl; recipes/viskg/params.yaml sets what a run changes)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from posttrain.config import HUB_ID, Registered, Section
from posttrain.stages import sections


class VisKGDataConfig(Section):  # viskg.data: the synthetic VQA set (recipes/viskg/data.py)
    grid: int = Field(3, ge=2, le=6)  # scenes are grid x grid cells
    cell: int = Field(8, ge=4)  # pixels per cell side (images are grid * cell square)
    n_objects: int = Field(4, ge=2)  # objects per scene, each a distinct (colour, shape) in its own cell
    max_hops: int = Field(3, ge=1, le=3)  # questions need 1..max_hops relations (uniform)
    n_train: int = Field(4000, gt=0)  # training questions (each on its own scene); SFT targets and RL prompts
    n_heldout: int = Field(200, gt=0)  # held-out questions (other scenes): greedy accuracy, format rate, tokens

    @model_validator(mode="after")
    def _fits(self) -> "VisKGDataConfig":
        if not self.max_hops < self.n_objects <= min(self.grid * self.grid, 12):
            raise ValueError(f"needs max_hops < n_objects <= min(grid*grid, 12 kinds), got {self.max_hops}, {self.n_objects}, grid {self.grid}")
        return self


class VisKGModelConfig(Section):  # viskg.model: the vision-language model (recipes/viskg/vlm.py)
    path: str | None = None  # a VisionLanguageModel directory, or a native image-text-to-text checkpoint + processor (LLaVA, ...); None: see below
    language_model: str | None = None  # with path None: a transformers causal-LM directory, given a fresh patch encoder; None: tiny
    hidden_size: int = Field(64, gt=0)  # the tiny Qwen2-shaped language model (and the patch encoder's width)
    layers: int = Field(2, gt=0)
    heads: int = Field(2, gt=0)

    @field_validator("path")
    @classmethod
    def _saved(cls, v: str | None) -> str | None:
        if v is not None and not Path(v).is_dir():
            raise ValueError(f"model path not found: {v} (a VisionLanguageModel directory or an image-text-to-text checkpoint)")
        return v

    @field_validator("language_model")
    @classmethod
    def _exists(cls, v: str | None) -> str | None:
        if v is not None and not Path(v).exists() and not HUB_ID.fullmatch(v):
            raise ValueError(f"model path not found: {v}")
        return v


class VisKGSFTConfig(Section):  # viskg.sft: stage viskg_sft
    steps: int = Field(600, gt=0)
    batch_size: int = Field(32, gt=0)
    lr: float = Field(0.002, gt=0)  # AdamW, linear warm-up then constant
    warmup_steps: int = Field(20, ge=0)
    max_grad_norm: float = Field(1.0, gt=0)
    negatives_per_positive: float = Field(0.333, ge=0, le=1)  # negative-rationale samples per positive one (specs §29: 1:3)
    log_every: int = Field(25, gt=0)
    checkpoint_every: int = Field(100, ge=0)  # 0: no checkpoints (nothing to resume)


class VisKGRewardWeights(Section):
    accuracy: float = Field(1.0, ge=0)
    format: float = Field(1.0, ge=0)
    compactness: float = Field(0.5, ge=0)


class VisKGRLConfig(Section):  # viskg.rl: stage viskg_rl
    advantage: Annotated[str, Registered("advantages", meta="on_rewards", why="needs token-level rollouts (VisKG has a reward matrix only)")] = "gdpo"  # gdpo: normalise each reward in its group, weighted sum, batch whitening | grpo: weighted sum, then group-normalise
    loss: Annotated[str, Registered("losses")] = "clip"  # objectives/policy_losses.py (one update per batch: the ratio is 1, the surrogate's gradient is A grad log pi)
    loss_agg: Annotated[str, Registered("loss_aggregations")] = "token_mean"
    weights: VisKGRewardWeights = VisKGRewardWeights()  # w_acc, w_fmt, w_kg
    kg_budget: int = Field(128, gt=0)  # T_budget of r_kg = 1 - min(1, graph tokens / T_budget)
    steps: int = Field(40, gt=0)
    prompts_per_step: int = Field(8, gt=0)  # questions per step, drawn from the training set
    group_size: int = Field(8, ge=2)  # G
    temperature: float = Field(1.0, gt=0)
    max_new_tokens: int = Field(160, gt=0)  # a caption of four objects is ~110 tokens with its reasoning
    clip_eps_low: float = Field(0.2, ge=0)
    clip_eps_high: float = Field(0.2, ge=0)
    epochs_per_batch: int = Field(1, gt=0)  # >1 reuses a rollout batch (the ratio then moves off 1)
    correction: Annotated[str, Registered("corrections")] = "none"  # off-policy correction of the loss (objectives/off_policy.py; docs/async.md)
    dynamic_sampling: bool = False  # DAPO: drop the questions whose samples all got equal rewards, draw more to refill
    dynamic_sampling_max_rollouts: int = Field(4, ge=0)  # bound on the extra rollouts per step
    std_scaling: Literal["group", "batch", "none"] = "group"  # GRPO's std (GDPO normalises every reward by its group std)
    std_eps: float = Field(0.0001, gt=0)  # GDPO's eps
    lr: float = Field(0.0003, gt=0)
    max_grad_norm: float = Field(1.0, gt=0)
    log_every: int = Field(5, gt=0)
    checkpoint_every: int = Field(10, ge=0)  # steps between checkpoints: `posttrain viskg_rl --resume`


class VisKGEvalConfig(Section):  # viskg.eval: greedy decoding of the held-out questions after each stage
    max_new_tokens: int = Field(160, gt=0)
    batch_size: int = Field(100, gt=0)
    n_table: int = Field(16, ge=0)  # held-out samples logged as an MLflow table
    n_images: int = Field(8, ge=0)  # held-out scenes logged as an image grid (with question, output, truth)


@sections.register("viskg", help="stages viskg_sft -> viskg_rl (recipes/viskg/dvc.yaml; docs/viskg.md): VisKG (specs §29), knowledge-graph VQA")
class VisKGConfig(Section):  # stages viskg_sft + viskg_rl: VisKG (specs §29)
    data: VisKGDataConfig = VisKGDataConfig()  # recipes/viskg/data.py: rendered scenes of coloured shapes on a grid, questions of 1..max_hops spatial relations
    representation: Literal["kg", "caption"] = "kg"  # kg: the question-specific graph; caption: the full-scene caption (the baseline)
    model: VisKGModelConfig = VisKGModelConfig()  # recipes/viskg/vlm.py: patch encoder -> soft tokens before the question, into a causal language model
    sft: VisKGSFTConfig = VisKGSFTConfig()  # stage viskg_sft: NLL on every target token, positives and negative rationales alike
    rl: VisKGRLConfig = VisKGRLConfig()  # stage viskg_rl: the core RL step; G samples per question, rewards [accuracy, format, compactness], clipped surrogate
    eval: VisKGEvalConfig = VisKGEvalConfig()  # after each stage: greedy decoding of the held-out questions
