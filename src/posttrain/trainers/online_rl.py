"""Online RL: sample G completions per prompt, score them, estimate advantages, take a policy step.
Under torchrun each rank rolls out its share of the step's prompts and the gradients are averaged
(trainers/distributed.py); rank 0 writes the checkpoints. With `training.sharding: fsdp` the policy and its frozen
reference are FSDP2-sharded (stages/rl.py): the rollout and the extras run on the policy's gathered weights
(`distributed.gathered`), the update on its shards, and FSDP averages the gradients (`check_shardable` refuses what
cannot run so).

The objective is whatever `rl.advantage` / `rl.loss` / `rl.loss_agg` / `rl.aux` name in their registries.
`OnlineRL` owns everything an update changes and computes exactly what the chosen parts declare:

- the extras they `need`, from the providers registry (trainers/extras.py), reading the frozen models by role;
- ONE policy forward per update pass, handed to the loss and every auxiliary term (`PolicyOutputs`): the
  sampled-token log-probs, plus full distributions, hidden states or scores of extra sequences only when a
  part declares it reads them, and no forward at all when nothing reads it;
- the trainable side modules the terms declare (registry meta `module`), in the same optimiser as the policy;
- the state objects the providers declare (registry meta `state`);
- the critic (role `critic`, rl.critic) when an extra reads it: a value head on a copy of the starting policy or
  a saved critic. When a part declares `critic=True` (the `value` loss) it is trained: its own parameter group
  (rl.critic.lr), clipped on its own, one critic forward with gradient per pass (`CriticOutputs.values`), and for
  the first rl.critic.warmup_steps updates only those parts are stepped, so the policy does not move. Otherwise
  the critic is frozen (RFPO's pretrained critic).

The model is reached through a `Policy` (rollout/policy.py: encode prompts, generate samples with recorded log-probs,
completion log-probs): `CausalLMPolicy` over `run.policy` unless `run.adapter` brings another (VisKG's
vision-language model, a flow model's denoising chain), which then gets the same step: dynamic sampling, off-policy
corrections, micro-batches, checkpoints and diagnostics. The KL term (rl.beta) is the k3 estimate on the sampled tokens'
log-probs against the reference's (the `ref_logp` extra), unless the policy supplies its own (`Policy.kl`: it reads
the frozen reference's forward on the batch, made once per update); `rl.adv_clip_max` clips the advantages.

Rollouts come from `rl.sampler` (rollout/samplers.py): `temperature` is the policy's own sampling at
rl.temperature (the log-probs recorded on the way are old_logp); another sampler (power, ppt) is not the policy's
distribution, so old_logp is recomputed as the policy's log-prob of the drawn tokens (docs/samplers.md).

`state_dict()` holds all of it, keyed by registry names, so a checkpoint needs no method names.
"""

from __future__ import annotations

import copy
import math
import random
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from posttrain.config import RLConfig
from posttrain.errors import UserError
from posttrain.registry import Registry, update_section
from posttrain.models.logprobs import completion_forward, sequence_logprobs
from posttrain.models.value import critic_from_policy, load_critic, save_critic, token_values
from posttrain.rollout.policy import CausalLMPolicy, Policy
from posttrain.rollout.sampling import Samples, StopStrings
from posttrain.objectives import aggregations, advantages, auxiliaries, losses, needs_of, policy_reads, trains_critic
from posttrain.objectives.presets import presets
from posttrain.objectives.aggregation import aggregate
from posttrain.objectives.diagnostics import composition_metrics
from posttrain.objectives.kl import k3_kl
from posttrain.objectives.loss_settings import LossSettings
from posttrain.objectives.off_policy import corrections, dropped_share, mismatch_figures, weighted_advantages
from posttrain.objectives.value_loss import CriticOutputs
from posttrain.rewards import reward_matrix, rewards
from posttrain.rollout import PolicyOutputs, RolloutBatch
from posttrain.rollout.pool import pool_policies
from posttrain.rollout.samplers import SampleRequest, draw, samplers
from posttrain.tasks import Example, Task
from posttrain.trainers import distributed
from posttrain.runtime import progress
from posttrain.trainers.common import optimizer_and_schedule
from posttrain.trainers.loop import TrainLoop
from posttrain.trainers.dynamic_sampling import concat, informative_groups, select_groups
from posttrain.trainers.extras import ExtraContext, check_providers, extras, provide, reward_context, role_missing, roles_needed


def rl_registries() -> dict[str, Registry]:
    """The registries an rl section names entries of (the keys its config markers use)."""
    return {"advantages": advantages, "losses": losses, "loss_aggregations": aggregations, "auxiliaries": auxiliaries,
            "rewards": rewards, "presets": presets, "extras": extras, "samplers": samplers,
            "corrections": corrections, "pool_policies": pool_policies}


def resolve_rl(rl: RLConfig, **update) -> RLConfig:
    """An rl section (with `update` applied; `options` merge block by block) checked against the registries, its
    options parsed, and every declared need given a provider: for the sections a stage derives (distill, rl_rm)."""
    rl = update_section(rl, "rl", rl_registries(), **update)
    check_providers(rl)
    return rl


def rl_of_section(section: Any, **fixed: Any) -> RLConfig:
    """A recipe's own RL section as the core step's settings: every key it shares with `rl` by name (advantage, loss,
    lr, group_size, corrections, ...), then `fixed` (its rewards, and the keys it names otherwise or does not expose),
    resolved as `resolve_rl` does; the rest keep `rl`'s defaults."""
    shared = {name: getattr(section, name) for name in type(section).model_fields if name in RLConfig.model_fields}
    return resolve_rl(RLConfig(**{**shared, **fixed}))


class PromptStream:
    """Endless shuffled passes over the training prompts; (epoch, position) is the whole state."""

    def __init__(self, examples: Sequence[Example], seed: int, epoch: int = 0, position: int = 0):
        self.examples, self.seed, self.epoch, self.position = examples, seed, epoch, position
        self._order = self._shuffle()

    def _shuffle(self) -> list[int]:
        order = list(range(len(self.examples)))
        random.Random(self.seed * 1_000_003 + self.epoch).shuffle(order)
        return order

    def take(self, n: int) -> list[Example]:
        out = []
        while len(out) < n:
            if self.position == len(self._order):
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._shuffle()
            out.append(self.examples[self._order[self.position]])
            self.position += 1
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position = state["epoch"], state["position"]
        self._order = self._shuffle()


@dataclass
class RLRun:
    policy: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    task: Task
    examples: Sequence[Example]
    cfg: RLConfig
    seed: int
    checkpoint_dir: Path
    config_hash: str
    models: dict[str, PreTrainedModel] = field(default_factory=dict)  # frozen models by role: teacher, base (distill), reference
    max_nonfinite_steps: int = 3  # training.max_nonfinite_steps (trainers/loop.py)
    max_unscored_steps: int = 3  # training.max_unscored_steps: consecutive steps in which no completion got a score
    keep_checkpoints: int = 2  # training.keep_checkpoints
    checkpoint_section: str = "rl"  # the section whose checkpoint_every set cfg.checkpoint_every (named in the divergence line)
    critic_out: Path | None = None  # where a trained critic is saved at the end (models/value.save_critic)
    adapter: Policy | None = None  # how `policy` is encoded, sampled and scored (rollout/policy.py); None: a causal LM's way

    @property
    def pad_id(self) -> int:
        """The id that pads token rows when rollouts join (dynamic sampling, async parts): the tokenizer's, or 0 for a
        policy without text tokens (a flow policy's placeholder ids are all 0)."""
        return self.tokenizer.pad_token_id if self.tokenizer is not None else 0


@dataclass(frozen=True)
class StepResult:
    batch: RolloutBatch
    texts: list[str]
    prompts: list[Example]  # the prompt of each group actually trained on, in group order
    metrics: dict[str, float]


def reward_metrics(batch: RolloutBatch) -> dict[str, float]:
    metrics = {}
    for k, name in enumerate(batch.reward_names):
        column = batch.rewards[:, k]
        finite = column[~torch.isnan(column)]
        metrics[f"reward/{name}_mean"] = float(finite.mean()) if finite.numel() else 0.0
        metrics[f"reward/{name}_std"] = float(finite.std()) if finite.numel() > 1 else 0.0
    metrics["reward/nan_count"] = float(torch.isnan(batch.rewards).sum())
    total = torch.nan_to_num(batch.rewards, nan=0.0) @ batch.reward_weights
    metrics["reward/total_mean"] = float(total.mean())
    return metrics


def train_accuracy(task: Task, batch: RolloutBatch, examples: Sequence[Example], texts: Sequence[str], finished: Sequence[bool],
                   verify: bool = True) -> float | None:
    """The share of a rollout's samples the task's verifier accepts, whatever rewards the run optimises (the
    `correctness` column when it is one of them: the same verifier, not scored twice). NaN (a sample the verifier
    could not judge) is left out; with none judged the result is NaN, which `history_accuracy` skips. Without
    `verify` (rl.verify_rollouts: a label-free run) or a task with no verifier (the TRM judge's), only the
    correctness reward counts, and without it there is no figure (None)."""
    if "correctness" in batch.reward_names:
        scores = batch.rewards[:, batch.reward_names.index("correctness")].float().cpu()
    elif verify and hasattr(task, "correctness_reward"):
        scores = torch.tensor([task.correctness_reward(t, f, e) for t, f, e in zip(texts, finished, examples)], dtype=torch.float32)
    else:
        return None
    judged = scores[~torch.isnan(scores)]
    return float(judged.mean()) if judged.numel() else float("nan")


class OnlineRL:
    """The optimiser, schedule, generator, frozen models by role, side modules and declared states of one
    online RL run over `run.policy`; `step(prompts)` is one update, its optimiser steps guarded by `loop`."""

    def __init__(self, run: RLRun, total_steps: int | None = None, loop: TrainLoop | None = None,
                 replicas: distributed.Context | None = None):
        cfg, policy = run.cfg, run.policy
        self.run, self.cfg = run, cfg
        self.replicas = replicas or distributed.current()  # the data-parallel ranks that share each update (async: the trainer alone)
        self.loop = loop or TrainLoop(max_nonfinite_steps=run.max_nonfinite_steps)
        self.device = next(policy.parameters()).device
        self.policy: Policy = run.adapter or CausalLMPolicy(policy, run.tokenizer, getattr(run.task, "sampler", None))
        self.own_kl = hasattr(self.policy, "kl")  # the policy's own KL reads the reference's forward, not the ref_logp extra
        self.needs = needs_of(cfg) - ({"ref_logp"} if self.own_kl else set())
        self.reads = policy_reads(cfg)
        self.models = dict(run.models)
        if self.policy.log_probs_only:
            check_log_probs_only(cfg, self.needs, self.reads, type(self.policy).__name__)
        if cfg.sampler != "temperature" and hasattr(run.task, "sampler"):
            raise UserError(f"rl.sampler: {cfg.sampler} draws single-turn answers; task {run.task.cfg.name!r} samples whole episodes (use temperature)")
        missing = sorted(roles_needed(cfg, optional=False) - set(self.models) - {"reference", "critic"})
        if missing:
            need = next(n for n in sorted(self.needs) if extras.entry(n).meta.get("role") == missing[0])
            raise role_missing(need, missing[0])
        if distributed.is_sharded(policy):
            check_shardable(cfg)
        if "reference" in roles_needed(cfg) and "reference" not in self.models:
            self.models["reference"] = starting_reference(policy)
        self.critic = None  # the critic when this run trains it (else a frozen role, if any part reads one)
        if "critic" in roles_needed(cfg) and "critic" not in self.models:  # made, like the reference, before a checkpoint loads
            path = cfg.critic.path
            self.models["critic"] = load_critic(path, self.device, next(policy.parameters()).dtype) if path else critic_from_policy(policy)
        if "critic" in self.models:
            trains = trains_critic(cfg)
            self.models["critic"].train(trains).requires_grad_(trains)
            self.critic = self.models["critic"] if trains else None
        self.states = {n: extras.entry(n).meta["state"]() for n in sorted(self.needs) if "state" in extras.entry(n).meta}
        self.modules = {
            name: auxiliaries.entry(name).meta["module"](policy.config, cfg.options_for(name)).to(self.device)
            for name in cfg.aux if "module" in auxiliaries.entry(name).meta
        }
        self.optimizer, self.schedule = optimizer_and_schedule(self._param_groups(), cfg.lr, 0.0, cfg.warmup_steps, total_steps or cfg.steps,
                                                                cfg.lr_schedule)
        self.generator = torch.Generator(device=self.device).manual_seed(run.seed)
        self.step_index = 0
        self.unscored_steps = 0  # consecutive steps in which no completion was scored (training.max_unscored_steps)
        self.warned_unscored = False  # a step with some unscored completions is said once per run

    def _param_groups(self) -> list[dict[str, Any]]:
        groups = [{"params": [p for p in self.run.policy.parameters() if p.requires_grad]}]
        for module in self.modules.values():
            groups.append({"params": list(module.parameters()), "lr": self.cfg.lr * getattr(module, "lr_scale", 1.0)})
        if self.critic is not None:
            groups.append({"params": list(self.critic.parameters()), "lr": self.cfg.critic.lr})
        return groups

    # -- checkpointed state ----------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Under torchrun a collective: each rank's generator (its own rollouts' draws), and a sharded policy's
        optimizer state gathered whole, keyed by parameter name."""
        policy = self.run.policy
        sharded = distributed.is_sharded(policy)
        return {
            "optimizer": distributed.full_optimizer_state(policy, self.optimizer) if sharded else self.optimizer.state_dict(),
            "schedule": self.schedule.state_dict(), "generator": distributed.all_gather_object(self.generator.get_state(), self.replicas),
            "step_index": self.step_index, "unscored_steps": self.unscored_steps, "states": {n: s.state_dict() for n, s in self.states.items()},
            "modules": {n: m.state_dict() for n, m in self.modules.items()},
            **({"critic": self.critic.state_dict()} if self.critic is not None else {}),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if distributed.is_sharded(self.run.policy):
            distributed.load_full_optimizer_state(self.run.policy, self.optimizer, state["optimizer"])
        else:
            self.optimizer.load_state_dict(state["optimizer"])
        self.schedule.load_state_dict(state["schedule"])
        generators = state["generator"]  # one per rank (a single state in checkpoints written before)
        self.generator.set_state(generators[self.replicas.rank % len(generators)] if isinstance(generators, list) else generators)
        self.step_index = state["step_index"]
        self.unscored_steps = state.get("unscored_steps", 0)  # absent from checkpoints written before the guard
        for name, saved in state["states"].items():
            self.states[name].load_state_dict(saved)
        for name, saved in state["modules"].items():
            self.modules[name].load_state_dict(saved)
        if "critic" in state:
            self.critic.load_state_dict(state["critic"])

    # -- one update ------------------------------------------------------------------------------------------

    def context(self, need: str) -> ExtraContext:
        run = self.run
        return ExtraContext(run.policy, run.tokenizer, run.task, self.cfg, self.models, self.step_index, self.generator, self.states.get(need),
                            self.policy)

    def rollout(self, prompts: list[Example]) -> tuple[RolloutBatch, list[str], dict[str, float]]:
        """Sample, decode and score one batch of prompts; returns the batch, the texts and rollout metrics."""
        cfg, run = self.cfg, self.run
        encoded = self.policy.encode(prompts, self.device)
        start = time.perf_counter()
        stop = StopStrings(run.tokenizer, cfg.stop)
        extra: dict[str, float] = {}
        texts = None
        if cfg.sampler != "temperature":
            samples, texts, extra = self.sampler_rollout(prompts, encoded.ids, encoded.mask)
        else:
            samples = self.policy.generate(encoded, group_size=cfg.group_size, max_new_tokens=cfg.max_new_tokens,
                                           temperature=cfg.temperature, generator=self.generator, stop=stop)
        seconds = time.perf_counter() - start
        batch, texts = self.score(prompts, encoded.ids, encoded.mask, samples, stop, texts, encoded.inputs)
        tokens = float(samples.completion_mask.sum())
        metrics = {"tokens_per_s": tokens / max(seconds, 1e-9), "completion_length": tokens / batch.size, **extra}
        expanded = [e for e in prompts for _ in range(cfg.group_size)]
        accuracy = train_accuracy(run.task, batch, expanded, texts, samples.finished.tolist(), run.cfg.verify_rollouts)
        if accuracy is not None:
            metrics["accuracy"] = accuracy
        if hasattr(run.task, "rollout_metrics"):  # a task's own figures of a batch (the market sandbox: each tool's share of the calls)
            metrics.update(run.task.rollout_metrics(texts))
        return batch, texts, metrics

    def score(self, prompts: list[Example], prompt_ids, prompt_mask, samples, stop: StopStrings,
              texts: list[str] | None = None, inputs: Mapping[str, Tensor] | None = None) -> tuple[RolloutBatch, list[str]]:
        """Decode (unless the sampler already gave the `texts`) and score the samples of `prompts` (group_size rows
        each, prompt-major) into a RolloutBatch; the prompts' other `inputs` (Prompts.inputs) and what the policy
        recorded per sample (`samples.extras`) go on it as extras."""
        cfg, run = self.cfg, self.run
        texts = self.policy.decode(samples, stop) if texts is None else texts
        expanded = [e for e in prompts for _ in range(cfg.group_size)]
        rewards, names, weights = reward_matrix(cfg.rewards, run.task, expanded, texts, samples.finished.tolist(), **reward_context(cfg, samples))
        batch = RolloutBatch(
            prompt_ids=prompt_ids.repeat_interleave(cfg.group_size, 0),
            prompt_mask=prompt_mask.repeat_interleave(cfg.group_size, 0),
            completion_ids=samples.completion_ids,
            completion_mask=samples.completion_mask,
            attention_mask=samples.attention,
            group=torch.arange(len(prompts), device=self.device).repeat_interleave(cfg.group_size),
            old_logp=samples.logp,
            rewards=rewards.to(self.device),
            reward_names=names,
            reward_weights=weights.to(self.device),
            extras={**{name: value.repeat_interleave(cfg.group_size, 0) for name, value in (inputs or {}).items()}, **samples.extras},
        )
        return batch, texts

    def sampler_rollout(self, prompts: list[Example], prompt_ids, prompt_mask) -> tuple[Samples, list[str], dict[str, float]]:
        """`rl.group_size` answers per prompt from `rl.sampler` (rollout/samplers.py). Its answers are not draws
        from the policy, so the log-probs it recorded are replaced by the policy's own on the drawn tokens (one
        no-grad forward at rl.temperature, the trainer's forward): old_logp is pi_old(y_t | x, y_<t), and the
        loss's ratio pi_theta / pi_old is taken against the policy before the update, not against the sampler."""
        cfg, policy, tok = self.cfg, self.run.policy, self.run.tokenizer
        request = SampleRequest(cfg.max_new_tokens, cfg.group_size, cfg.temperature, tuple(cfg.stop))
        drawn = draw(cfg.sampler, policy, tok, prompts, request, cfg.options_for(cfg.sampler), self.generator)
        s = drawn.samples
        with torch.no_grad():
            logp = completion_forward(policy, prompt_ids.repeat_interleave(cfg.group_size, 0), prompt_mask.repeat_interleave(cfg.group_size, 0),
                                      s.completion_ids, s.attention, cfg.temperature).logp
        samples = replace(s, logp=logp.float() * s.completion_mask)
        metrics = {f"rollout/{k}": float(v) for k, v in drawn.stats.items()}
        metrics["rollout/forward_tokens_per_sample"] = drawn.total_forward_tokens / max(len(drawn.texts), 1)
        metrics["rollout/sampler_logp_gap"] = float(((s.logp - samples.logp) * s.completion_mask).sum() / s.completion_mask.sum().clamp(min=1))
        return samples, drawn.texts, metrics

    def collect(
        self, prompts: list[Example], more_prompts: Callable[[int], list[Example]] | None
    ) -> tuple[RolloutBatch, list[str], list[Example], dict[str, float]]:
        """One rollout; with `rl.dynamic_sampling`, drop the groups whose rewards are all equal and roll out more
        prompts (at most `dynamic_sampling_max_rollouts` times) until `prompts_per_step` groups are informative.
        Returns the batch, its texts, the prompt of each group (in group-id order) and rollout metrics."""
        cfg = self.cfg
        batch, texts, metrics = self.rollout(prompts)
        if not cfg.dynamic_sampling:
            return batch, texts, prompts, metrics
        parts, kept_texts, kept_prompts, dropped, extra = [], [], [], 0, 0
        while True:
            keep = informative_groups(batch)
            rows = keep[torch.unique(batch.group, return_inverse=True)[1]]
            dropped += int((~keep).sum())
            parts.append(select_groups(batch, keep))
            kept_texts += [t for t, r in zip(texts, rows.tolist()) if r]
            kept_prompts += [p for p, k in zip(prompts, keep.tolist()) if k]
            missing = cfg.prompts_per_step - len(kept_prompts)
            if missing <= 0 or extra >= cfg.dynamic_sampling_max_rollouts or more_prompts is None:
                break
            extra += 1
            prompts = more_prompts(missing)
            batch, texts, _ = self.rollout(prompts)
        metrics.update({"dynamic_sampling/dropped_groups": float(dropped), "dynamic_sampling/extra_rollouts": float(extra)})
        if not kept_prompts:  # nothing informative within the bound: train on the last batch (zero advantages)
            return batch, texts, prompts, metrics
        batch = concat(parts, self.run.pad_id)
        n = min(len(kept_prompts), cfg.prompts_per_step)
        rows = batch.group < n
        full = select_groups(batch, torch.arange(len(kept_prompts), device=batch.group.device) < n)
        return full, [t for t, r in zip(kept_texts, rows.tolist()) if r], kept_prompts[:n], metrics

    def critic_warmup(self) -> bool:
        """Whether this update is one of the first rl.critic.warmup_steps, in which only the critic learns."""
        return self.critic is not None and 0 < self.step_index <= self.cfg.critic.warmup_steps

    def policy_forward(self, batch: RolloutBatch) -> PolicyOutputs:
        """The one policy forward of an update pass: only what the configured parts read (none during the
        critic's warm-up), plus the critic's values with gradient when the critic trains."""
        outputs = self._policy_outputs(batch) if not self.critic_warmup() else PolicyOutputs(logp=None)
        if self.critic is None:
            return outputs
        values = token_values(self.critic, batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.attention_mask)
        return CriticOutputs(**{f.name: getattr(outputs, f.name) for f in fields(outputs)}, values=values)

    def update_forward(self, batch: RolloutBatch) -> tuple[PolicyOutputs, Callable[[Tensor], None]]:
        """The policy forward of one update pass and how to back-propagate a loss built on it.

        With `rl.micro_batch` smaller than the batch, the forward runs in micro-batches without gradient and its
        outputs are joined into leaves the loss is built on; the loss's backward gives d loss / d outputs, and each
        micro-batch is run again with gradient and back-propagated from its slice of those. Every loss, term and
        correction sees the whole batch (batch statistics included), so the gradient is the whole batch's, while
        the activations held at once are one micro-batch's. Each micro-batch's second pass draws the random
        numbers of its first (dropout)."""
        size = self.cfg.micro_batch
        if not size or size >= batch.size:
            return self.policy_forward(batch), Tensor.backward
        spans = [(start, min(start + size, batch.size)) for start in range(0, batch.size, size)]
        states, parts = [], []
        with torch.no_grad():
            for start, stop in spans:
                states.append(_rng_state(self.device))
                parts.append(self.policy_forward(batch.rows(start, stop)))
        outputs = _joined(parts)

        def backward(loss: Tensor) -> None:
            loss.backward()  # into the joined outputs (and the side modules' own parameters, if a term uses them)
            wanted = [(name, leaf.grad) for name, leaf in _differentiable(outputs) if leaf.grad is not None]
            for (start, stop), state in zip(spans, states):
                _set_rng_state(self.device, state)
                part = dict(_differentiable(self.policy_forward(batch.rows(start, stop))))
                torch.autograd.backward([part[name] for name, _ in wanted],
                                        [grad.narrow(_row_dim(name), start, stop - start) for name, grad in wanted])

        return outputs, backward

    def update_loss(self, batch: RolloutBatch, outputs: PolicyOutputs, adv: Tensor, proximal: Tensor | None, terms: list[str],
                    warmup: bool, metrics: dict[str, float], reference: PolicyOutputs | None = None) -> tuple[Tensor, dict[str, float]]:
        """The loss of one update pass on `outputs` (the correction, the policy loss, the KL and the terms) and its figures."""
        cfg = self.cfg
        if outputs.logp is not None:
            reads_adv = {"advantages": adv} if corrections.entry(cfg.correction).meta.get("advantages") else {}
            fixed = corrections.get(cfg.correction)(batch.old_logp, proximal, batch.completion_mask, cfg.options_for(cfg.correction), **reads_adv)
            metrics["mismatch/masked_share"] = dropped_share(fixed, batch.completion_mask)
            loss, loss_metrics = losses.get(cfg.loss)(outputs.logp, fixed.old_logp, weighted_advantages(adv, fixed.weight), fixed.mask,
                                                      LossSettings.of(cfg))
            loss_metrics.update(fixed.metrics)
        else:
            loss, loss_metrics = torch.zeros((), device=self.device), {}
        if cfg.beta > 0 and not warmup:
            per_token = self.policy.kl(outputs, reference) if self.own_kl else k3_kl(outputs.logp, batch.extras["ref_logp"])
            kl = aggregate(cfg, per_token, batch.completion_mask)
            loss = loss + cfg.beta * kl
            loss_metrics["kl"] = float(kl.detach())
        for name in terms:  # auxiliary terms (distillation, alignment, the value loss) read the same forward
            term, term_metrics = auxiliaries.get(name)(batch, outputs, cfg, self.modules.get(name))
            loss = loss + term
            loss_metrics.update(term_metrics)
        return loss, loss_metrics

    def rows_apart(self, batch: RolloutBatch, terms: list[str], warmup: bool) -> bool:
        """Whether this update's loss splits over the batch's rows: micro-batching on, and every part in use reads only a
        row's own log-probs (registry meta `rows=True` on the loss, the correction and the aggregation; no term, no
        critic, no KL of the policy's own, nothing read but `logp`). Then `update_by_rows` gives the whole batch's gradient with one forward."""
        cfg = self.cfg
        return (0 < cfg.micro_batch < batch.size and not terms and not warmup and self.critic is None and self.reads == {"logp"}
                and not self.own_kl
                and all(registry.entry(name).meta.get("rows", False)
                        for registry, name in ((losses, cfg.loss), (corrections, cfg.correction), (aggregations, cfg.loss_agg))))

    def update_by_rows(self, batch: RolloutBatch, adv: Tensor, proximal: Tensor | None) -> PolicyOutputs:
        """One update pass in micro-batches of `rl.micro_batch` rows, each run once with gradient and back-propagated
        from the whole batch's loss with the other rows' log-probs held fixed (at the sampler's, a finite stand-in).
        With a loss that splits over rows (`rows_apart`) a row's gradient reads only its own values and the
        aggregation's normaliser (the whole batch's mask), so the gradient is `update_forward`'s without its first,
        gradient-free forward. Returns the joined outputs without gradient (the pass's figures are computed on them)."""
        size, fill = self.cfg.micro_batch, batch.old_logp.detach()
        parts = []
        for start in range(0, batch.size, size):
            stop = min(start + size, batch.size)
            part = self.policy_forward(batch.rows(start, stop))
            logp = torch.cat([fill[:start], part.logp, fill[stop:]])
            rows_proximal = proximal if proximal is not None else torch.cat([fill[:start], part.logp.detach(), fill[stop:]])
            loss, _ = self.update_loss(batch, PolicyOutputs(logp=logp), adv, rows_proximal, [], False, {})
            if loss.requires_grad:
                loss.backward()
            parts.append(PolicyOutputs(logp=part.logp.detach(), entropy=part.entropy))
        entropy = None if parts[0].entropy is None else torch.cat([p.entropy for p in parts])
        return PolicyOutputs(logp=torch.cat([p.logp for p in parts]), entropy=entropy)

    def _policy_outputs(self, batch: RolloutBatch) -> PolicyOutputs:
        policy, reads = self.run.policy, self.reads
        scored = {}
        for read in sorted(r for r in reads if r.startswith("scores:")):
            name = read.removeprefix("scores:")
            packed = batch.extras[name]  # [B, 3, W]: token ids, attention mask, loss mask
            scored[name] = sequence_logprobs(policy, packed[:, 0], packed[:, 1])
        if not reads & {"logp", "logprobs", "hidden"}:
            return PolicyOutputs(logp=None, scored=scored)
        out = self.policy.forward(batch, self.cfg.temperature, full="logprobs" in reads, hidden="hidden" in reads, entropy=True)
        return replace(out, scored=scored)

    @torch.no_grad()
    def reference_outputs(self, batch: RolloutBatch) -> PolicyOutputs:
        """The frozen reference's forward on the batch, for a policy that supplies its own KL (`Policy.kl`): once per
        update, every pass compares against it."""
        return self.policy.over(self.models["reference"]).forward(batch, self.cfg.temperature)

    def check_scored(self, batch: RolloutBatch) -> None:
        """A completion every reward left unscored (NaN: the function returned None or NaN) gets no advantage, so a
        step in which no completion was scored trains nothing: more than `max_unscored_steps` such steps in a row
        stop the run with one line naming the rewards that returned nothing; some unscored completions warn once."""
        unscored = torch.isnan(batch.rewards).all(dim=1) if batch.rewards.numel() else torch.zeros(0, dtype=torch.bool)
        if unscored.numel() and bool(unscored.all()):
            self.unscored_steps += 1
        else:
            self.unscored_steps = 0
            if bool(unscored.any()) and not self.warned_unscored:
                self.warned_unscored = True
                print(f"posttrain: warning: step {self.step_index}: {float(unscored.float().mean()):.0%} of the completions got no "
                      f"score from any reward ({', '.join(batch.reward_names)}): they train nothing (shown once)", file=sys.stderr)
        if self.unscored_steps > self.run.max_unscored_steps:
            silent = [n for k, n in enumerate(batch.reward_names) if bool(torch.isnan(batch.rewards[:, k]).all())]
            raise UserError(f"step {self.step_index}: no completion was scored on {self.unscored_steps} consecutive steps: "
                            f"reward{'s' if len(silent) > 1 else ''} {', '.join(repr(n) for n in silent)} returned nothing (None or NaN) for every completion, so nothing "
                            f"trains (training.max_unscored_steps is {self.run.max_unscored_steps})")

    def step(self, prompts: list[Example], more_prompts: Callable[[int], list[Example]] | None = None,
             collected: tuple[RolloutBatch, list[str], list[Example], dict[str, float]] | None = None) -> StepResult:
        """One update on `prompts`: rollout, rewards, extras, advantages, `epochs_per_batch` policy passes (an
        optimizer step each) and one schedule step. With `rl.dynamic_sampling`, `more_prompts(n)` supplies refill prompts.
        `collected` (batch, texts, prompts, metrics): a batch sampled elsewhere (the async workers) instead of a rollout."""
        cfg, policy = self.cfg, self.run.policy
        estimate = advantages.get(cfg.advantage)
        self.step_index += 1
        with distributed.gathered(policy):  # FSDP: the decoders read the whole weights (a no-op for an unsharded policy)
            batch, texts, prompts, metrics = collected or self.collect(prompts, more_prompts)
            self.check_scored(batch)
            batch = provide(self.needs, self.context, prompts, batch)
        adv = estimate(batch, cfg)
        if cfg.adv_clip_max is not None:
            adv = adv.clamp(-cfg.adv_clip_max, cfg.adv_clip_max)
        warmup = self.critic_warmup()
        terms = [name for name in cfg.aux if not warmup or auxiliaries.entry(name).meta.get("critic")]
        proximal = None
        reference = self.reference_outputs(batch) if self.own_kl and cfg.beta > 0 and not warmup else None
        for _ in range(cfg.epochs_per_batch):
            if self.rows_apart(batch, terms, warmup):  # each micro-batch back-propagates its own rows' loss: one forward each
                outputs = self.update_by_rows(batch, adv, proximal)
                backward = None
            else:
                outputs, backward = self.update_forward(batch)
            if outputs.logp is not None and proximal is None:  # the first pass runs before any step of this update: the proximal policy, v_now
                proximal = outputs.logp.detach()
                metrics.update(mismatch_figures(batch.old_logp, proximal, batch.completion_mask))
            with torch.set_grad_enabled(backward is not None):  # the row-wise pass back-propagated already: its loss is a figure
                loss, loss_metrics = self.update_loss(batch, outputs, adv, proximal, terms, warmup, metrics, reference)
            if backward is not None and loss.requires_grad:  # `none` loss and no term: nothing to learn from this batch
                backward(loss)
            for model in (policy, *self.modules.values(), *([self.critic] if self.critic is not None else [])):
                distributed.reduce_gradients(model, average=True, ctx=self.replicas)  # torchrun: equal prompt shares, so the mean of rank means
            guarded = loss
            if self.critic is not None:  # clipped on its own; a non-finite critic gradient skips the whole step
                critic_norm = float(torch.nn.utils.clip_grad_norm_(self.optimizer.param_groups[-1]["params"], cfg.max_grad_norm))
                loss_metrics["value/grad_norm"] = critic_norm
                guarded = loss if math.isfinite(critic_norm) else float("nan")
            grad_norm = self.loop.optimizer_step(  # clips the policy
                self.step_index, guarded, self.optimizer.param_groups[0]["params"], self.optimizer, cfg.max_grad_norm)
        self.schedule.step()
        metrics.update(reward_metrics(batch))
        metrics.update(composition_metrics(batch, adv, cfg.std_eps))
        metrics.update(loss_metrics)
        metrics.update(loss=float(loss.detach()), grad_norm=float(grad_norm), lr=self.schedule.get_last_lr()[0], advantage_abs_mean=float(adv.abs().mean()),
                       nonfinite_steps=float(self.loop.nonfinite_steps))
        if self.critic is not None:
            metrics["critic_warmup"] = float(warmup)
        if outputs.entropy is not None:
            metrics["entropy"] = float(aggregate(cfg, outputs.entropy, batch.completion_mask))
        return StepResult(batch, texts, prompts, metrics)


def starting_reference(policy: PreTrainedModel) -> PreTrainedModel:
    """The `reference` role: a frozen copy of the starting policy (made before a checkpoint loads, so a resumed run
    keeps the same reference)."""
    return copy.deepcopy(policy).eval().requires_grad_(False)


def check_shardable(cfg: RLConfig) -> None:
    """`training.sharding: fsdp` shards the policy and its reference; refuse, in one line, what would need other models
    or a rollout outside the sync loop: the async workers (they load published whole weights), a critic and the
    trainable side modules of auxiliary terms (replicas beside the sharded policy, in its optimizer)."""
    refused = [f"rl.mode {cfg.mode}"] if cfg.mode != "sync" else []
    refused += ["a critic (the gae advantage, the value term)"] if "critic" in roles_needed(cfg) else []
    refused += [f"rl.aux {name} (it trains its own module)" for name in cfg.aux if "module" in auxiliaries.entry(name).meta]
    if refused:
        raise UserError(f"training.sharding=fsdp does not support {'; '.join(refused)}; use training.sharding=replicate")


def check_log_probs_only(cfg: RLConfig, needs: frozenset[str], reads: frozenset[str], policy: str) -> None:
    """A policy that gives completion log-probs only (`Policy.log_probs_only`: VisKG's, MotionInsight's), its own and
    its reference's for the KL term: refuse, in one line, the settings whose parts read more of it (full distributions, hidden states, scored
    sequences), need another provider's extras (a teacher's, the greedy baseline's), draw with another sampler, or run
    the async workers."""
    refused = [f"rl.sampler {cfg.sampler}"] if cfg.sampler != "temperature" else []
    refused += [f"rl.mode {cfg.mode}"] if cfg.mode != "sync" else []
    refused += [f"the need {n!r}" for n in sorted(needs - {"ref_logp"})] + [f"reading {r!r}" for r in sorted(reads - {"logp"})]
    refused += [f"rl.aux {', '.join(cfg.aux)}"] if cfg.aux else []
    if refused:
        raise UserError(f"{policy} gives completion log-probs only, so it cannot take {'; '.join(refused)}")


def _row_dim(name: str) -> int:
    """The sample dimension of a policy output (`hidden` is [L, B, T, d]; the rest put samples first)."""
    return 1 if name == "hidden" else 0


def _differentiable(outputs: PolicyOutputs) -> list[tuple[str, Tensor]]:
    """(name, tensor) of every output a loss may differentiate: all but the detached entropy; `scored` by its keys."""
    found = []
    for f in fields(outputs):
        value = getattr(outputs, f.name)
        if f.name == "scored":
            found += [(f"scored:{key}", tensor) for key, tensor in value.items()]
        elif isinstance(value, Tensor) and f.name != "entropy":
            found.append((f.name, value))
    return found


def _joined(parts: list[PolicyOutputs]) -> PolicyOutputs:
    """The micro-batches' outputs (computed without gradient) as one batch's: each differentiable one a leaf that
    collects the loss's gradient."""
    def join(name: str, values: list[Tensor | None]) -> Tensor | None:
        if values[0] is None:
            return None
        joined = torch.cat(values, dim=_row_dim(name))
        return joined if name == "entropy" else joined.requires_grad_(True)

    first = parts[0]
    joined = {f.name: join(f.name, [getattr(p, f.name) for p in parts]) for f in fields(first) if f.name != "scored"}
    scored = {key: join(f"scored:{key}", [p.scored[key] for p in parts]) for key in first.scored}
    return type(first)(**joined, scored=scored)


def _rng_state(device: torch.device) -> tuple[Tensor, Tensor | None]:
    return torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None


def _set_rng_state(device: torch.device, state: tuple[Tensor, Tensor | None]) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


def train_sync(
    run: RLRun, resume: bool, on_log: Callable[[int, dict[str, float]], None],
    on_step: Callable[[int, StepResult], None] | None = None,
) -> tuple[list[dict[str, float]], list[dict[str, object]]]:
    """`train_online_rl` (trainers/rl.py) for `rl.mode: sync`: sample, then update, in turn."""
    cfg, policy = run.cfg, run.policy
    ctx = distributed.current()
    if ctx.active and (cfg.prompts_per_step % ctx.world_size or cfg.dynamic_sampling):
        raise UserError(f"under torchrun rl.prompts_per_step ({cfg.prompts_per_step}) must be a multiple of the {ctx.world_size} processes and rl.dynamic_sampling off")
    loop = TrainLoop(run.checkpoint_dir, run.config_hash, cfg.checkpoint_every, resume, run.max_nonfinite_steps, run.keep_checkpoints,
                     run.checkpoint_section)
    trainer = OnlineRL(run, loop=loop)  # the reference (a copy of the starting policy) is made before a checkpoint loads
    stream = PromptStream(run.examples, run.seed)
    parts = {"trainer": trainer, "stream": stream}
    start_step, saved = loop.restore(policy, parts)
    history: list[dict[str, float]] = saved.get("history", [])

    policy.train()
    bar = progress(cfg.steps, f"rl ({cfg.advantage}+{cfg.loss})", initial=start_step)
    for step in range(start_step + 1, cfg.steps + 1):
        prompts = distributed.shard(stream.take(cfg.prompts_per_step), ctx)  # every rank draws the same prompts, rolls out its share
        result = trainer.step(prompts, more_prompts=stream.take)
        metrics = result.metrics
        history.append(metrics)
        if on_step is not None:
            on_step(step, result)
        bar.update()
        bar.set_postfix(acc=f"{metrics.get('accuracy', float('nan')):.2f}")
        if step % cfg.log_every == 0 or step == cfg.steps:
            on_log(step, metrics)
        loop.checkpoint(step, cfg.steps, policy, parts, {"history": history})
    bar.close()
    distributed.check_in_sync(policy, ctx)
    if run.critic_out is not None and trainer.critic is not None and ctx.is_main:
        save_critic(trainer.critic, run.critic_out)
        run.tokenizer.save_pretrained(run.critic_out)
    if start_step == cfg.steps:  # resumed a finished run: nothing was sampled in this process
        return history, []
    batch = result.batch
    table = [
        {"prompt": result.prompts[i // cfg.group_size].prompt, "completion": text, **{n: float(batch.rewards[i, k]) for k, n in enumerate(batch.reward_names)}}
        for i, text in enumerate(result.texts)
    ]
    return history, table
