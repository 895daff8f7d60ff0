"""Settings: one pydantic model per `params.yaml` section, frozen, unknown keys rejected.

Every setting has its default on its model, and the comment on its line says what it means (`settings_help.field_comments`:
the launchers' forms show it); a params file holds only what a run changes, and a section or key it leaves out
takes the model's default. A component's own settings (`rl.options.<name>`) live on the options model it
registers, with their defaults. `load(params, overrides)` reads and validates the structure; a bad key or value
raises `UserError` with one line that names the key, before any work is done.

This module is a leaf: it imports no component. A field whose value names a registry entry is marked
`Registered("<registry>")`, and a per-component settings mapping is marked `OptionsOf("<registry>", ...)`
(posttrain.markers); `posttrain.resolve` checks those markers against the registries (names, options, meta rules) at
the CLI and preflight boundary, and the Airflow / Kubeflow schemas read the same markers. What a setting means is the
comment on its line (posttrain.settings_help reads it for the forms).
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import json
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator, model_validator

from posttrain.errors import UserError
from posttrain.markers import Options, OptionsOf, Registered


HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")  # "org/name"; any other model path must exist on disk



class Section(BaseModel):
    # no NaN or infinite number is a setting (`lr: .inf`, a NaN reward weight): refused with the key's name
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, validate_default=True)

    def options_for(self, name: str) -> BaseModel | None:
        """The parsed settings of the component registered as `name` (None when it takes none). Options are
        parsed once, by `posttrain.resolve`; reading an unresolved block is a programming error."""
        value = getattr(self, "options", {}).get(name)
        if value is None or isinstance(value, BaseModel):
            return value
        raise RuntimeError(f"options of {name!r} were not resolved: load settings with posttrain.resolve.load / resolve.section")


class PipelineConfig(Section):
    name: str = "posttrain"  # the MLflow experiment
    seed: int = 0
    device: Literal["auto", "cpu", "cuda"] = "auto"  # auto | cpu | cuda
    threads: int = Field(0, ge=0)  # 0: leave torch's default


class TrackingConfig(Section):
    uri: str = "sqlite:///mlflow.db"  # relative sqlite paths resolve against the working directory
    artifact_root: str = "mlartifacts"
    enabled: bool = True


class TrainingConfig(Section):  # what every training loop shares (trainers/loop.py)
    max_nonfinite_steps: int = Field(3, ge=0)  # consecutive steps with a non-finite loss or gradient skipped before the stage fails
    max_unscored_steps: int = Field(3, ge=0)  # consecutive RL steps in which no reward scored any completion before the stage fails
    keep_checkpoints: int = Field(2, ge=2)  # the newest, and older ones to fall back to when the newest cannot be read
    # under torchrun (trainers/distributed.py): `replicate` keeps a full model on every rank; `fsdp` shards the
    # policy's parameters, gradients and optimizer state over the ranks (FSDP2 fully_shard per decoder layer + root):
    # the sft and rl stages (rl: the frozen reference too; each rollout runs on the policy's gathered weights)
    sharding: Literal["replicate", "fsdp"] = "replicate"


class TaskConfig(Section):
    name: Annotated[str, Registered("tasks")] = "arithmetic"
    digits: int = Field(2, ge=1, le=6)
    operations: tuple[Literal["+", "-", "*"], ...] = ("+",)
    n_train: int = Field(4000, gt=0)
    n_heldout: int = Field(500, gt=0)
    options: Annotated[Options, OptionsOf("tasks")] = {}  # per-task settings: task.options.<task name>.<key>

    @field_validator("operations")
    @classmethod
    def _nonempty(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not v:
            raise ValueError("needs at least one operation")
        return v


class LoraConfig(Section):
    r: int = Field(0, ge=0)  # 0 disables LoRA
    alpha: int = Field(16, gt=0)
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")


class ModelConfig(Section):
    path: str | None = None  # a local directory or hub id; None builds a tiny model from the sizes below
    arch: Literal["qwen2", "llama"] = "qwen2"
    hidden_size: int = Field(64, gt=0)
    layers: int = Field(2, gt=0)
    heads: int = Field(4, gt=0)
    kv_heads: int = Field(2, gt=0)
    intermediate_size: int = Field(256, gt=0)
    max_positions: int = Field(64, gt=0)
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    lora: LoraConfig = LoraConfig()
    # prompts (models/chat.py): `auto` renders them with the tokenizer's chat template when it has one, `off` never
    chat_template: Literal["auto", "off"] = "auto"
    system_prompt: str | None = None  # the system turn of examples without their own `system`; None: none
    max_prompt_tokens: int = Field(default=0, ge=0)  # 0: no limit; a longer prompt keeps its last tokens
    # training and sampling (models/precision.py)
    gradient_checkpointing: bool = False  # recompute activations in the backward pass (less memory, more time)
    autocast: Literal["none", "bf16", "fp16"] = "none"  # mixed precision of every forward pass; fp16 needs CUDA
    # sampling (models/decoders.py): replay each decode step as a CUDA graph (Llama-family models on CUDA, no autocast)
    cuda_graphs: bool = False
    # sampling (models/decoders.py): decode rollouts from a copy of the weights cast to this dtype at each rollout
    # (Llama-family models without LoRA; training stays in `dtype`, the gap shows as mismatch/k3); None: `dtype`
    sampler_dtype: Literal["float32", "bfloat16", "float16"] | None = None

    @field_validator("path")
    @classmethod
    def _path_exists(cls, v: str | None) -> str | None:
        if v is not None and not Path(v).exists() and not HUB_ID.fullmatch(v):
            raise ValueError(f"model path not found: {v}")
        return v

    @model_validator(mode="after")
    def _heads_divide(self) -> "ModelConfig":
        if self.hidden_size % self.heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by heads {self.heads}")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads {self.heads} is not divisible by kv_heads {self.kv_heads}")
        return self


class CheckpointConfig(Section):  # stage `import`: a GGUF file or a checkpoint to a save_pretrained directory (models/gguf.py)
    # a .gguf file, `package:<module>/<file>` (a file inside an installed package), or a checkpoint directory / hub id
    source: str | None = None
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"  # the saved weights (a GGUF is dequantised to it)


class SFTConfig(Section):
    steps: int = Field(1000, ge=0)  # 0: no fine-tuning, the checkpoint at model.path is the stage's output (a pipeline that skips SFT)
    batch_size: int = Field(64, gt=0)
    lr: float = Field(0.003, gt=0)
    warmup_steps: int = Field(20, ge=0)
    weight_decay: float = Field(0.0, ge=0)
    max_grad_norm: float = Field(1.0, gt=0)
    n_examples: int = Field(500, ge=0)  # 0: every training example
    log_every: int = Field(20, gt=0)
    checkpoint_every: int = Field(200, ge=0)  # 0: no checkpoints (--resume then starts over)


class RewardSpec(Section):
    name: Annotated[str, Registered("rewards")]
    weight: float = Field(default=1.0, ge=0)  # finite, >= 0: 0 logs a reward without training on it; a penalty is a reward below 0


class CriticConfig(Section):
    """The value model of critic-based estimators (`gae`): built and trained by the rl trainer (models/value.py)."""

    path: str | None = None  # null: a value head on a copy of the starting policy; else a saved critic / causal-LM directory
    lr: float = Field(0.0005, gt=0)  # the critic's learning rate (its own parameter group; the policy keeps rl.lr)
    warmup_steps: int = Field(0, ge=0)  # updates in which only the critic learns (the policy does not move)


class AsyncWorkersConfig(Section):
    """The rollout workers of `rl.mode: async` (trainers/async_rl.py)."""

    count: int = Field(2, ge=1)  # worker processes on this machine, each generating whole groups (under torchrun: ranks 1.. instead)
    queued_groups: int = Field(8, ge=1)  # prompts handed out ahead of the trainer (bounds the in-flight work)
    timeout_s: float = Field(120, gt=0)  # a worker, rollout rank or weight sync silent this long ends the run with one line
    deterministic: bool = False  # a fixed schedule of weight refreshes instead of wall-clock races (exact resume, tests)
    refresh_every_tokens: int = Field(2, ge=1)  # deterministic: a worker loads the newest published weights every this many decode steps


class RLConfig(Section):
    mode: Literal["sync", "async"] = "sync"  # async: rollout workers generate while the trainer updates (docs/async.md)
    correction: Annotated[str, Registered("corrections")] = "none"  # off-policy correction of the loss (objectives/off_policy.py)
    pool_policy: Annotated[str, Registered("pool_policies")] = "none"  # async: which pooled groups are rejected before a draw (rollout/pool.py)
    workers: AsyncWorkersConfig = AsyncWorkersConfig()  # rl.mode async only
    preset: Annotated[str | None, Registered("presets")] = None  # a named method (objectives/presets.py), expanded below explicit overrides
    advantage: Annotated[str, Registered("advantages")] = "grpo"  # posttrain registry: advantages
    loss: Annotated[str, Registered("losses")] = "clip"  # posttrain registry: losses
    loss_agg: Annotated[str, Registered("loss_aggregations")] = "token_mean"  # token_mean | seq_mean | token_sum_norm | seq_mean_token_sum
    aux: tuple[Annotated[str, Registered("auxiliaries")], ...] = ()  # auxiliary loss terms added to the policy loss, by registry name
    rewards: tuple[RewardSpec, ...] = ({"name": "correctness", "weight": 1.0}, {"name": "format", "weight": 0.1})
    steps: int = Field(1000, gt=0)
    prompts_per_step: int = Field(32, gt=0)
    group_size: int = Field(8, ge=2)
    max_new_tokens: int = Field(6, gt=0)
    temperature: float = Field(1.0, gt=0)
    lr: float = Field(0.0005, gt=0)
    warmup_steps: int = Field(30, ge=0)
    lr_schedule: Literal["cosine", "constant"] = "cosine"  # after the warm-up: cosine decay to 0 at rl.steps, or a constant rate
    max_grad_norm: float = Field(1.0, gt=0)
    epochs_per_batch: int = Field(1, gt=0)  # >1 reuses a rollout batch; the ratio then moves off 1
    # samples per forward/backward pass of an update (0: the whole batch in one). Smaller bounds the activation memory
    # at the cost of one more forward without gradient; the gradient is the whole batch's (trainers/online_rl.py)
    micro_batch: int = Field(0, ge=0)
    clip_eps_low: float = Field(0.2, ge=0)
    clip_eps_high: float = Field(0.2, ge=0)
    std_scaling: Literal["group", "batch", "none"] = "group"  # group | batch | none
    std_eps: float = Field(0.0001, gt=0)
    adv_clip_max: float | None = Field(None, gt=0)  # advantages clipped to +-this after the estimator (Flow-GRPO's); None: no clip
    beta: float = Field(0.0, ge=0)  # KL weight (k3, or the policy's own KL: rollout/policy.py); 0 skips the reference forward pass entirely
    dynamic_sampling: bool = False  # DAPO: drop groups whose rewards are all equal, sample more prompts to refill
    dynamic_sampling_max_rollouts: int = Field(4, ge=0)  # bound on the extra rollouts per step
    stop: tuple[str, ...] = ()  # generation ends at the first of these strings; the completion is cut before it
    # the `accuracy` metric: each rollout scored by the task's verifier even when correctness is not a reward (a
    # monitor, never trained on); false for label-free runs, where no answer may enter the step (the rfpo preset)
    verify_rollouts: bool = True
    eval_every: int = Field(default=0, ge=0)  # > 0: greedy held-out accuracy at the start and every this many steps (stages/rl.py)
    eval_prompts: int = Field(default=50, gt=0)  # the held-out prompts of that check (the first of data's heldout.jsonl)
    overlong_buffer: int = Field(2, gt=0)  # DAPO's L_cache for the `overlong` reward (tokens before max_new_tokens)
    checkpoint_every: int = Field(100, ge=0)  # 0: no checkpoints
    log_every: int = Field(1, gt=0)
    critic: CriticConfig = CriticConfig()  # the value model, when the objective reads one (`gae` advantage, `value` term)
    # per-method settings, keyed by the registered name of the estimator / loss / reward that declares them
    # (`options=<Section model>` in its registry entry); e.g. `options: {qglas: {gamma_max: 0.5}}`
    options: Annotated[Options, OptionsOf("advantages", "losses", "rewards", "auxiliaries", "corrections", "pool_policies", "samplers")] = {}  # per-method settings: rl.options.<registered name>.<key> (see `posttrain registry`)
    # the sampler that draws the rollouts (rollout/samplers.py; its settings in rl.options.<sampler>): `temperature` is
    # the policy's own distribution at rl.temperature; any other is off-policy and the trainer recomputes old_logp
    sampler: Annotated[str, Registered("samplers", meta="stochastic", why="draws one answer per prompt (a group needs rl.group_size different ones)")] = "temperature"  # draws the rollouts: temperature (the policy at rl.temperature) | power | ppt (settings in rl.options.<sampler>; off-policy: old_logp recomputed, docs/samplers.md)

    @field_validator("rewards")
    @classmethod
    def _some_rewards(cls, v: tuple[RewardSpec, ...]) -> tuple[RewardSpec, ...]:
        if not v:
            raise ValueError("needs at least one reward")
        names = [r.name for r in v]
        if len(set(names)) != len(names):
            raise ValueError(f"reward listed twice: {names}")
        return v


class BestOfNConfig(Section):
    """Best-of-N in `eval` (eval/best_of_n.py): N answers per prompt from `eval.sampler`, one kept per prompt."""

    n: int = Field(0, ge=0)  # answers drawn per prompt; 0: off (N > 1 needs a stochastic sampler: checked by posttrain.resolve)
    picks: tuple[Literal["oracle", "vote", "likelihood"], ...] = Field(("oracle", "vote", "likelihood"), min_length=1)  # the scorers, each reported as bon_<pick>_accuracy


class EvalConfig(Section):
    n_prompts: int = Field(500, gt=0)
    samples_per_prompt: int = Field(1, gt=0)
    temperature: float = Field(1.0, gt=0)
    max_new_tokens: int = Field(6, gt=0)
    batch_size: int = Field(500, gt=0)
    n_table: int = Field(20, ge=0)
    stop: tuple[str, ...] = ()  # as rl.stop
    # inference-time sampler (rollout/samplers.py) reported as sampler_* next to greedy_* and sampled_*
    sampler: Annotated[str, Registered("samplers")] = "greedy"
    options: Annotated[Options, OptionsOf("samplers")] = {"power": {"mcmc_steps": 4}}  # per-sampler settings: eval.options.<sampler>.<key>
    best_of_n: BestOfNConfig = BestOfNConfig()  # N answers per prompt from eval.sampler, one kept per prompt, reported as bon_* (eval/best_of_n.py)
    group_by: tuple[str, ...] = ()  # metadata keys: greedy / sampled accuracy also per value of each (eval/harness.py)


class GPUConfig(Section):
    accelerator: str = "nvidia.com/gpu"  # Kubernetes resource name of the accelerator
    count: int = Field(1, ge=1)
    node_selector: dict[str, str] = {}  # e.g. {cloud.google.com/gke-accelerator: nvidia-h100-80gb}
    tolerations: tuple[dict[str, str], ...] = ({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},)  # lets the pods onto a tainted GPU node pool


class SweepConfig(Section):
    # the arms: presets or advantage estimators (names checked by posttrain.orchestration.sweep, which knows both)
    objectives: tuple[str, ...] = Field(("grpo", "rloo", "dr_grpo"), min_length=1)  # arms, each once: a preset (all its rl keys: dr_grpo's aggregation too) or an advantage estimator
    parallelism: int = Field(2, ge=1)

    @field_validator("objectives")
    @classmethod
    def _unique(cls, arms: tuple[str, ...]) -> tuple[str, ...]:
        twice = sorted({a for a in arms if arms.count(a) > 1})
        if twice:
            raise ValueError(f"{twice[0]!r} is listed twice (each arm writes its own output folder)")
        return arms


class AirflowConfig(Section):
    executor: Literal["bash", "kubernetes"] = "bash"  # bash: `posttrain` in Airflow's own environment | kubernetes: a pod per task
    runs_dir: str = "airflow-runs"  # bash executor: each DAG run writes under <runs_dir>/<run id>/ (relative to the repo)
    namespace: str = "default"  # kubernetes executor
    volume: str = "posttrain-runs"  # kubernetes executor: the PersistentVolumeClaim holding runs_dir, mounted by every pod


class TrainerJobConfig(Section):
    """Multi-node training through Kubeflow Trainer: a launcher task submits a TrainJob (torchrun on every node)."""

    enabled: bool = False  # true: the stages below run as TrainJobs, torchrun across num_nodes x gpu.count processes
    stages: tuple[Annotated[str, Registered("stages")], ...] = ("sft", "rl", "distill", "rl_rm")  # the training stages that run as TrainJobs when enabled
    runtime: str = "torch-distributed"  # ClusterTrainingRuntime that runs torchrun (Kubeflow Trainer's torch-distributed)
    num_nodes: int = Field(2, ge=1)
    namespace: str = "kubeflow"
    deadline_seconds: int = Field(86400, gt=0)  # the launcher deletes the TrainJob and fails past this
    poll_seconds: float = Field(30, gt=0)
    volume: str = "posttrain-shared"  # PersistentVolumeClaim (ReadWriteMany) the launcher and every node mount: inputs and outputs
    mount_path: str = "/mnt/posttrain"


class OrchestrationConfig(Section):
    image: str = "ghcr.io/posttrain/posttrain:0.1.0"  # the one image every component and pod runs (docker/Dockerfile)
    gpu: GPUConfig = GPUConfig()  # training and evaluation tasks (stages registered with gpu=True)
    secrets: dict[str, dict[str, str]] = {"posttrain-credentials": {"AWS_ACCESS_KEY_ID": "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY": "AWS_SECRET_ACCESS_KEY"}}  # secret name -> {ENV_VAR: key}
    env: dict[str, str] = {}  # plain settings for every task, e.g. {MLFLOW_S3_ENDPOINT_URL: http://minio:9000}
    retries: int = Field(2, ge=0)  # on every task (they all talk to MLflow / S3); training resumes from its checkpoint
    retry_backoff: str = "60s"
    retry_backoff_factor: float = Field(2.0, ge=1.0)
    caching: bool = True  # on stages registered deterministic (the default); the key covers config and image
    imports: dict[str, str] = {}  # task id -> URI of an existing output: the task is not run, its consumers read the URI
    trainer: TrainerJobConfig = TrainerJobConfig()  # multi-node training (Kubeflow): the launcher submits a Kubeflow Trainer TrainJob
    sweep: SweepConfig = SweepConfig()  # the sweep pipeline / DAG: rl + eval per objective, then compare
    airflow: AirflowConfig = AirflowConfig()


class PairTrainingConfig(Section):
    """What the `reward_model` and `preference` stages share: where pairs come from, the optimiser loop, and
    per-method settings in `options` (each subclass marks the registry of the methods it selects)."""

    data: Annotated[str, Registered("preference_data")] = "policy_pairs"  # preference_data registry: how pairs are built from the task's examples (when `pairs` is null)
    pairs: str | None = None  # a file of pairs (data/preferences.py: JSON lines, Parquet or CSV; local or s3://) to train on instead
    n_pairs: int = Field(6000, gt=0)  # generated training pairs
    n_heldout_pairs: int = Field(600, gt=0)  # generated held-out pairs (from held-out prompts)
    sample_tokens: int = Field(6, gt=0)  # response budget when a builder samples from the policy (policy_pairs)
    steps: int = Field(5000, gt=0)  # bt: BT steps; trm: the judgement warm-up's steps (its checking circuit forms late)
    batch_size: int = Field(64, gt=0)
    lr: float = Field(0.003, gt=0)
    warmup_steps: int = Field(10, ge=0)
    max_grad_norm: float = Field(1.0, gt=0)  # bt: the BT loop's gradient clip; trm: the warm-up's (pairwise RL: rl.max_grad_norm)
    log_every: int = Field(20, gt=0)
    checkpoint_every: int = Field(500, ge=0)  # 0: no checkpoints (bt: BT steps; trm: warm-up and pairwise-RL steps)
    options: Options  # <section>.options.<registered name>.<key>

    @field_validator("pairs")
    @classmethod
    def _pairs_exist(cls, v: str | None) -> str | None:
        if v is not None and "://" not in v and not Path(v).is_file():  # s3:// is read (and checked) by the stage
            raise ValueError(f"preference file not found: {v}")
        return v



class RewardModelConfig(PairTrainingConfig):
    kind: Annotated[str, Registered("reward_models")] = "bt"  # bt (Bradley-Terry value head) | trm (Thinking Reward Model)
    prompts: Literal["disjoint", "same"] = "disjoint"  # the reward model's train prompts: disjoint from rl_rm's RL prompts, or the same
    rl_rewards: tuple[RewardSpec, ...] = ({"name": "bt", "weight": 1.0}, {"name": "correctness", "weight": 0.0})  # the `rl_rm` stage's reward list (rl settings otherwise); the model's path is its input
    options: Annotated[Options, OptionsOf("reward_models")] = {}

    @field_validator("rl_rewards")
    @classmethod
    def _some_rewards(cls, v: tuple[RewardSpec, ...]) -> tuple[RewardSpec, ...]:
        return RLConfig._some_rewards(v)


class PreferenceConfig(PairTrainingConfig):
    objective: Annotated[str, Registered("preference_objectives")] = "dpo"  # dpo | gm_dpo | abc_align
    beta: float = Field(0.1, gt=0)  # DPO's inverse temperature on the log-ratio margin
    options: Annotated[Options, OptionsOf("preference_objectives")] = {}
    data: Annotated[str, Registered("preference_data")] = "task_pairs"
    n_pairs: int = Field(4000, gt=0)
    steps: int = Field(200, gt=0)
    lr: float = Field(0.0003, gt=0)
    checkpoint_every: int = Field(50, ge=0)


class DistillConfig(Section):
    method: Annotated[str, Registered("presets", meta="distill", why="is not a distillation method")] = "opd"  # applied on the rl section
    steps: int = Field(40, gt=0)  # kept short: the stage runs in the default pipeline after rl
    prompts_per_step: int = Field(16, gt=0)




class Config(Section):
    pipeline: PipelineConfig = PipelineConfig()
    tracking: TrackingConfig = TrackingConfig()
    training: TrainingConfig = TrainingConfig()  # every training loop (trainers/loop.py)
    task: TaskConfig = TaskConfig()
    model: ModelConfig = ModelConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    sft: SFTConfig = SFTConfig()
    rl: RLConfig = RLConfig()
    distill: DistillConfig = DistillConfig()  # the `distill` stage: the rl settings with a distillation method, a frozen teacher
    eval: EvalConfig = EvalConfig()
    reward_model: RewardModelConfig = RewardModelConfig()  # stage reward_model: a reward model trained on preference pairs from the SFT model
    preference: PreferenceConfig = PreferenceConfig()  # stage preference: offline preference training of the SFT policy
    orchestration: OrchestrationConfig = OrchestrationConfig()  # how Kubeflow and Airflow launch the stages; not a run setting (no stage reads it)

    def section_hash(self, *sections: str) -> str:
        """A stable digest of the named sections (used to refuse resuming under changed settings)."""
        dump = {s: getattr(self, s).model_dump(mode="json") for s in sections}
        return hashlib.sha256(json.dumps(dump, sort_keys=True).encode()).hexdigest()[:16]


# --- sections a recipe or plugin adds -------------------------------------------------------------------------

@dataclass(frozen=True)
class AddedSection:
    """A settings section a recipe or an installed plugin registers (`posttrain.stages.sections`): its name in the
    params file, its model, its default (the model's own defaults unless given) and the one line the forms show."""

    name: str
    model: type[Section]
    default: Section | None = None
    help: str = ""


_settings_models: dict[tuple[tuple[str, type[Section]], ...], type[Config]] = {}


def settings_model(added: typing.Iterable[AddedSection] = ()) -> type[Config]:
    """`Config` with the `added` sections as fields: the settings of a run in a process where recipes and plugins
    registered them (`posttrain.resolve.settings_model()` passes every registered one). One class per set of
    sections, so the models compare equal across calls."""
    added = sorted(added, key=lambda a: a.name)
    key = tuple((a.name, a.model) for a in added)
    if key not in _settings_models:
        taken = [a.name for a in added if a.name in Config.model_fields]
        if taken:
            raise UserError(f"settings section {taken[0]!r} is a core section; a recipe or plugin must choose another name")
        fields: dict[str, Any] = {a.name: (a.model, Field(a.default if a.default is not None else a.model(), description=a.help or None))
                                  for a in added}
        _settings_models[key] = create_model("Config", __base__=Config, __module__=__name__, **fields)
    return _settings_models[key]


PresetExpander = Callable[[str, dict[str, Any]], dict[str, Any]]  # (preset name, rl section so far) -> the rl keys it sets


def load(params: Path | str, overrides: list[str] | tuple[str, ...] = (), expand_preset: PresetExpander | None = None,
         model: type[Config] = Config, known: type[Config] | None = None) -> Config:
    """Read `params` (YAML), apply `section.key=value` overrides (values parsed as YAML), validate the structure.
    A params file may start from another one (`extends: path`, relative to the file; see `read_params`).
    `expand_preset` turns `rl.preset` into its keys (below explicit overrides, above params.yaml); without it a
    preset is refused. Registry names are not checked here: `posttrain.resolve.load` does both. `model` is the
    settings class (`settings_model(...)` with the sections recipes and plugins add; the core sections alone by
    default): a section no registered model takes is refused with its name. `known` (default `model`) has every
    registered section when `model` holds only those a stage reads: a section of `known` that `model` lacks is
    taken out unvalidated, so a mistake in a section the run does not read cannot stop it."""
    known = known or model
    raw = read_params(Path(params))
    _apply_preset(raw, overrides, expand_preset, known)
    for item in overrides:
        _apply_override(raw, item, known)
    for section in [s for s in raw if s in known.model_fields and s not in model.model_fields]:
        del raw[section]
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        raise UserError(one_line(e, known)) from None  # `known`: a misspelt section's hint names any registered one


EXTENDS = "extends"


def read_params(path: Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The sections of a params file. With a top-level `extends: <params file>` (relative to this file) the file
    holds only what it changes: it is merged over the file it extends, mappings key by key, any other value
    (a list, a scalar) replacing the base's. A project keeps its own short params file on top of the defaults."""
    if not path.is_file():
        raise UserError(f"params file not found: {path}" + (f" (extended by {_seen[-1]})" if _seen else ""))
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise UserError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(raw, dict):
        raise UserError(f"{path}: expected a mapping of sections at the top level")
    if EXTENDS not in raw:
        return raw
    base = raw.pop(EXTENDS)
    if not isinstance(base, str) or not base:
        raise UserError(f"{path}: {EXTENDS} must name a params file, got {base!r}")
    base_path = (path.parent / base).resolve()
    if base_path in _seen or base_path == path.resolve():
        raise UserError(f"{path}: {EXTENDS} {base} leads back to itself")
    return _merged(read_params(base_path, (*_seen, path.resolve())), raw)


def _merged(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in update.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _apply_preset(raw: dict[str, Any], overrides: list[str] | tuple[str, ...], expand: PresetExpander | None,
                  root: type[BaseModel] = Config) -> None:
    """Expand `rl.preset` (from params.yaml or an override) into its rl keys, in place, so that the explicit
    overrides applied afterwards win over the preset, and the preset wins over params.yaml."""
    probe = copy.deepcopy(raw)
    for item in overrides:
        _apply_override(probe, item, root)
    rl = probe.get("rl")
    name = rl.get("preset") if isinstance(rl, dict) else None
    if name is None:
        return
    if expand is None:
        raise UserError("rl.preset: presets are expanded by posttrain.resolve.load (this loader has no registry)")
    section = raw.get("rl") if isinstance(raw.get("rl"), dict) else {}
    raw["rl"] = {**section, **expand(str(name), section)}


def override_value(key: str, value: str) -> Any:
    """A `--set` value, read as YAML (numbers, lists, null), except that a ` #` cannot silently cut it: an unquoted
    text holding one is taken whole (`system_prompt=... then #### and the number`), and a list or mapping holding
    one stops with one line (quote the text inside it)."""
    try:
        parsed = yaml.safe_load(value)
    except yaml.YAMLError:
        raise UserError(f"{key}: cannot parse value {value!r}") from None
    if re.search(r"(?:^|\s)#", value):  # YAML reads the rest as a comment
        if isinstance(parsed, (list, dict)):
            raise UserError(f"{key}: ' #' starts a YAML comment in {value!r}; quote the text that holds it")
        if value.strip()[:1] not in ("'", '"'):
            return value.strip()
    return parsed


def check_key(key: str, root: type[BaseModel] = Config) -> None:
    """Refuse a `section.key` that names no setting of `root`, with the line a `--set` of it would get."""
    _apply_override({}, f"{key}=null", root)


def _apply_override(raw: dict[str, Any], item: str, root: type[BaseModel] = Config) -> None:
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise UserError(f"--set expects section.key=value, got {item!r}")
    parts = key.strip().split(".")
    node: dict[str, Any] = raw
    model: type[BaseModel] | None = root  # None below a free-form mapping (rl.options), checked on validation
    for i, part in enumerate(parts):
        fields = model.model_fields if model is not None else {part: None}
        if part not in fields:
            where = ".".join(parts[:i]) or "params"
            close = difflib.get_close_matches(part, list(fields), n=1)
            hint = f" (did you mean {'.'.join(parts[:i] + close)!r}?)" if close else ""
            raise UserError(f"unknown key {key!r}: {where} has no {part!r}{hint}")
        annotation = fields[part].annotation if model is not None else dict
        last = i == len(parts) - 1
        if last:
            node[part] = override_value(key, value)
        else:
            is_section = isinstance(annotation, type) and issubclass(annotation, BaseModel)
            if not is_section and typing.get_origin(annotation) is not dict and annotation is not dict:
                raise UserError(f"unknown key {key!r}: {'.'.join(parts[: i + 1])} is not a section")
            child = node.get(part)
            if not isinstance(child, dict):
                child = node[part] = {}
            node, model = child, (annotation if is_section else None)


def one_line(e: ValidationError, root: type[BaseModel] | None = None, prefix: str = "") -> str:
    """The first validation error as one line naming its full key (`prefix` + location in `root`)."""
    err = e.errors()[0]
    loc = prefix + ".".join(str(p) for p in err["loc"])
    msg = err["msg"].removeprefix("Value error, ")
    if msg.startswith((loc + ".", "unknown key")):  # raised by a nested check that already names the key
        return msg
    if err["type"] == "extra_forbidden":
        parent = err["loc"][:-1]
        model: Any = root or Config
        for p in parent:
            f = getattr(model, "model_fields", {}).get(p) if isinstance(p, str) else None
            model = f.annotation if f is not None else None
        options = list(getattr(model, "model_fields", {}) or {})
        close = difflib.get_close_matches(str(err["loc"][-1]), options, n=1)
        hint = f" (did you mean {prefix + '.'.join([*map(str, parent), close[0]])!r}?)" if close else ""
        return f"unknown key {loc!r}{hint}"
    shown = err.get("input")
    shown_ok = shown is not None and not isinstance(shown, dict) and len(repr(shown)) < 80 and repr(shown) not in msg
    got = f" (got {shown!r})" if shown_ok else ""
    more = f" [+{len(e.errors()) - 1} more]" if len(e.errors()) > 1 else ""
    return f"{loc}: {msg}{got}{more}" if loc else f"{msg}{got}{more}"  # a model-level check names its keys itself
