"""Online RL: sample G completions per prompt, score them, estimate advantages, take a policy step.
Under torchrun each rank rolls out its share of the step's prompts and the gradients are averaged
(trainers/distributed.py); rank 0 writes the checkpoints.

The objective is whatever `rl.advantage` / `rl.loss` / `rl.loss_agg` name in their registries; this loop
only computes what the chosen parts declare they need (e.g. reference log-probs only when beta > 0, the
greedy completion's reward only for ReMax): `EXTRAS` maps each need to the function that provides it.
"""

from __future__ import annotations

import copy
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from posttrain.config import RLConfig
from posttrain.errors import UserError
from posttrain.models.logprobs import completion_logprobs
from posttrain.objectives import advantages, auxiliaries, losses, needs_of
from posttrain.objectives.aggregation import aggregate
from posttrain.objectives.diagnostics import composition_metrics
from posttrain.objectives.kl import k3_kl
from posttrain.rewards import reward_matrix
from posttrain.rollout import RolloutBatch
from posttrain.models.sampling import sample
from posttrain.models.sampling import decode_completions
from posttrain.tasks import Example, Task
from posttrain.trainers import distributed
from posttrain.trainers.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from posttrain.models.sampling import encode_prompts
from posttrain.trainers.common import optimizer_and_schedule, progress
from posttrain.trainers.dynamic_sampling import concat, informative_groups, select_groups


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

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}


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
    teachers: dict[str, PreTrainedModel] = field(default_factory=dict)  # frozen "teacher" / "base" models (distill stage)
    state: dict[str, object] = field(default_factory=dict)  # "step" and the state of stateful schedules (GATS, UniOPSD)


def rollout(run: RLRun, prompts: list[Example], generator: torch.Generator) -> tuple[RolloutBatch, list[str], dict[str, float]]:
    """Sample, decode and score one batch of prompts; returns the batch, the texts and rollout metrics."""
    cfg, tok = run.cfg, run.tokenizer
    device = next(run.policy.parameters()).device
    prompt_ids, prompt_mask = encode_prompts(tok, [e.prompt for e in prompts], device)
    start = time.perf_counter()
    sampler = run.task.sampler(tok) if hasattr(run.task, "sampler") else sample  # multi-turn envs sample whole episodes
    samples = sampler(
        run.policy, prompt_ids, prompt_mask, group_size=cfg.group_size, max_new_tokens=cfg.max_new_tokens,
        eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, temperature=cfg.temperature, generator=generator,
    )
    seconds = time.perf_counter() - start
    texts = decode_completions(tok, samples)
    expanded = [e for e in prompts for _ in range(cfg.group_size)]
    rewards, names, weights = reward_matrix(cfg.rewards, run.task, expanded, texts, samples.finished.tolist(), **reward_context(cfg, samples))
    batch = RolloutBatch(
        prompt_ids=prompt_ids.repeat_interleave(cfg.group_size, 0),
        prompt_mask=prompt_mask.repeat_interleave(cfg.group_size, 0),
        completion_ids=samples.completion_ids,
        completion_mask=samples.completion_mask,
        group=torch.arange(len(prompts), device=device).repeat_interleave(cfg.group_size),
        old_logp=samples.logp,
        rewards=rewards.to(device),
        reward_names=names,
        reward_weights=weights.to(device),
    )
    tokens = float(samples.completion_mask.sum())
    metrics = {"tokens_per_s": tokens / max(seconds, 1e-9), "completion_length": tokens / batch.size}
    return batch, texts, metrics


def reward_context(cfg: RLConfig, samples) -> dict[str, object]:
    """What rewards may declare they need besides the text (see rewards.reward_matrix)."""
    return {"lengths": samples.completion_mask.sum(-1).cpu(), "max_len": cfg.max_new_tokens, "overlong_buffer": cfg.overlong_buffer, "rl": cfg}


def collect(
    run: RLRun, prompts: list[Example], generator: torch.Generator, more_prompts: Callable[[int], list[Example]] | None
) -> tuple[RolloutBatch, list[str], list[Example], dict[str, float]]:
    """One rollout; with `rl.dynamic_sampling`, drop the groups whose rewards are all equal and roll out more
    prompts (at most `dynamic_sampling_max_rollouts` times) until `prompts_per_step` groups are informative.
    Returns the batch, its texts, the prompt of each group (in group-id order) and rollout metrics."""
    cfg = run.cfg
    batch, texts, metrics = rollout(run, prompts, generator)
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
        batch, texts, _ = rollout(run, prompts, generator)
    metrics.update({"dynamic_sampling/dropped_groups": float(dropped), "dynamic_sampling/extra_rollouts": float(extra)})
    if not kept_prompts:  # nothing informative within the bound: train on the last batch (zero advantages)
        return batch, texts, prompts, metrics
    batch = concat(parts, run.tokenizer.pad_token_id)
    n = min(len(kept_prompts), cfg.prompts_per_step)
    rows = batch.group < n
    full = select_groups(batch, torch.arange(len(kept_prompts), device=batch.group.device) < n)
    return full, [t for t, r in zip(kept_texts, rows.tolist()) if r], kept_prompts[:n], metrics


def reference_logp(run: RLRun, prompts: list[Example], batch: RolloutBatch, reference: PreTrainedModel | None) -> torch.Tensor:
    """[B, T] sampled-token log-probs under the frozen reference (no gradient)."""
    if reference is None:
        raise ValueError("the objective needs reference log-probs but no reference model was given")
    with torch.no_grad():
        logp, _ = completion_logprobs(reference, batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask, run.cfg.temperature)
    return logp


@torch.no_grad()
def greedy_rewards(run: RLRun, prompts: list[Example], batch: RolloutBatch, reference: PreTrainedModel | None) -> torch.Tensor:
    """[B] ReMax baseline: the weighted reward of one greedy completion of each row's prompt (NaN -> 0)."""
    cfg, tok = run.cfg, run.tokenizer
    device = batch.group.device
    prompt_ids, prompt_mask = encode_prompts(tok, [e.prompt for e in prompts], device)
    samples = sample(
        run.policy, prompt_ids, prompt_mask, group_size=1, max_new_tokens=cfg.max_new_tokens,
        eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, temperature=cfg.temperature, greedy=True,
    )
    texts = decode_completions(tok, samples)
    rewards, _, weights = reward_matrix(cfg.rewards, run.task, prompts, texts, samples.finished.tolist(), **reward_context(cfg, samples))
    per_prompt = torch.nan_to_num(rewards, nan=0.0) @ weights
    return per_prompt.to(device)[batch.group]


def distribution_task(run: RLRun, need: str) -> Task:
    """The task, when it has outcomes and target distributions (e.g. `distribution`); else a UserError."""
    if callable(getattr(run.task, "outcome", None)) and callable(getattr(run.task, "target", None)):
        return run.task
    parts = ((run.cfg.advantage, advantages), (run.cfg.loss, losses))
    who = " and ".join(n for n, registry in parts if need in registry.entry(n).meta.get("needs", ()))
    raise UserError(f"{who} needs a distribution-matching task (task.name: distribution); task {run.task.cfg.name!r} has no target distribution")


def outcomes(run: RLRun, prompts: list[Example], batch: RolloutBatch, reference: PreTrainedModel | None) -> torch.Tensor:
    """[B] 0-based index of each completion's outcome in its task's outcome set; -1 when unparseable."""
    task = distribution_task(run, "outcomes")
    found = [task.outcome(text) for text in decode_completions(run.tokenizer, batch)]
    return torch.tensor([-1 if k is None else k for k in found], device=batch.group.device)


def target_probs(run: RLRun, prompts: list[Example], batch: RolloutBatch, reference: PreTrainedModel | None) -> torch.Tensor:
    """[B, K] the target distribution stated by each row's prompt."""
    task = distribution_task(run, "target_probs")
    return torch.tensor([task.target(p) for p in prompts], device=batch.group.device)[batch.group]


EXTRAS: dict[str, Callable[..., torch.Tensor]] = {
    "ref_logp": reference_logp, "greedy_rewards": greedy_rewards, "outcomes": outcomes, "target_probs": target_probs,
}
from posttrain.trainers.distill_extras import PROVIDERS as _DISTILL_PROVIDERS  # noqa: E402  (teacher-side extras)
from posttrain.trainers.distill_extras import export_state, import_state  # noqa: E402

EXTRAS.update(_DISTILL_PROVIDERS)


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
    if "correctness" in batch.reward_names:
        metrics["accuracy"] = metrics["reward/correctness_mean"]
    return metrics


@dataclass(frozen=True)
class StepResult:
    batch: RolloutBatch
    texts: list[str]
    prompts: list[Example]  # the prompt of each group actually trained on, in group order
    metrics: dict[str, float]


def policy_step(
    run: RLRun, prompts: list[Example], generator: torch.Generator, optimizer, schedule, reference: PreTrainedModel | None = None,
    more_prompts: Callable[[int], list[Example]] | None = None,
) -> StepResult:
    """One update on `prompts`: rollout, rewards, advantages, `epochs_per_batch` policy passes (an optimizer step
    each) and one schedule step. With `rl.dynamic_sampling`, `more_prompts(n)` supplies refill prompts."""
    cfg, policy = run.cfg, run.policy
    estimate = advantages.get(cfg.advantage)
    policy_loss = losses.get(cfg.loss)
    run.state["step"] = run.state.get("step", 0) + 1
    batch, texts, prompts, metrics = collect(run, prompts, generator, more_prompts)
    for need in sorted(needs_of(cfg)):
        batch = batch.with_extras(**{need: EXTRAS[need](run, prompts, batch, reference)})
    adv = estimate(batch, cfg)
    for _ in range(cfg.epochs_per_batch):
        logp, entropy = completion_logprobs(
            policy, batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask, cfg.temperature, with_entropy=True
        )
        loss, loss_metrics = policy_loss(logp, batch.old_logp, adv, batch.completion_mask, cfg)
        if cfg.beta > 0:
            kl = aggregate(cfg, k3_kl(logp, batch.extras["ref_logp"]), batch.completion_mask)
            loss = loss + cfg.beta * kl
            loss_metrics["kl"] = float(kl.detach())
        for name in cfg.aux:  # auxiliary terms (distillation, alignment): their own forward pass, added to the loss
            term, term_metrics = auxiliaries.get(name)(run, batch)
            loss = loss + term
            loss_metrics.update(term_metrics)
        loss.backward()
        distributed.reduce_gradients(policy, average=True)  # torchrun: equal prompt shares, so the mean of rank means
        grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    schedule.step()
    metrics.update(reward_metrics(batch))
    metrics.update(composition_metrics(batch, adv, cfg.std_eps))
    metrics.update(loss_metrics)
    metrics.update(
        loss=float(loss.detach()), grad_norm=float(grad_norm), lr=schedule.get_last_lr()[0],
        entropy=float(aggregate(cfg, entropy, batch.completion_mask)), advantage_abs_mean=float(adv.abs().mean()),
    )
    return StepResult(batch, texts, prompts, metrics)


def train_online_rl(
    run: RLRun, resume: bool, on_log: Callable[[int, dict[str, float]], None]
) -> tuple[list[dict[str, float]], list[dict[str, object]]]:
    """Run `cfg.steps` policy updates; return the per-step metric history (restored on resume) and a
    table of the last step's completions."""
    cfg, policy = run.cfg, run.policy
    device = next(policy.parameters()).device
    needs = needs_of(cfg)
    ctx = distributed.current()
    if ctx.active and (cfg.prompts_per_step % ctx.world_size or cfg.dynamic_sampling):
        raise UserError(f"under torchrun rl.prompts_per_step ({cfg.prompts_per_step}) must be a multiple of the {ctx.world_size} processes and rl.dynamic_sampling off")
    reference = None
    if "ref_logp" in needs:  # a frozen copy of the starting policy; never built when beta == 0
        reference = copy.deepcopy(policy).eval().requires_grad_(False)
    optimizer, schedule = optimizer_and_schedule(
        [p for p in policy.parameters() if p.requires_grad], cfg.lr, 0.0, cfg.warmup_steps, cfg.steps
    )
    stream = PromptStream(run.examples, run.seed)
    generator = torch.Generator(device=device).manual_seed(run.seed)
    history: list[dict[str, float]] = []
    start_step = 0
    found = latest_checkpoint(run.checkpoint_dir) if resume else None
    if found is not None:
        state = load_checkpoint(found, policy, run.config_hash)  # the reference stays the starting policy
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        stream = PromptStream(run.examples, run.seed, **state["stream"])
        generator.set_state(state["generator"])
        history = state["history"]
        start_step = state["step"]
        run.state.update(import_state(state.get("run_state", {})), step=start_step)

    policy.train()
    bar = progress(cfg.steps, f"rl ({cfg.advantage}+{cfg.loss})", initial=start_step)
    for step in range(start_step + 1, cfg.steps + 1):
        prompts = distributed.shard(stream.take(cfg.prompts_per_step), ctx)  # every rank draws the same prompts, rolls out its share
        result = policy_step(run, prompts, generator, optimizer, schedule, reference, more_prompts=stream.take)
        metrics = result.metrics
        history.append(metrics)
        bar.update()
        bar.set_postfix(acc=f"{metrics.get('accuracy', float('nan')):.2f}")
        if step % cfg.log_every == 0 or step == cfg.steps:
            on_log(step, metrics)
        if cfg.checkpoint_every and step % cfg.checkpoint_every == 0 and step < cfg.steps and ctx.is_main:
            save_checkpoint(
                run.checkpoint_dir, step, policy,
                {
                    "optimizer": optimizer.state_dict(), "schedule": schedule.state_dict(), "stream": stream.state(),
                    "generator": generator.get_state(), "history": history, "config_hash": run.config_hash,
                    "run_state": export_state(run.state),  # schedules with memory (GATS, UniOPSD, PR-OPD projectors)
                },
            )
    bar.close()
    distributed.check_in_sync(policy, ctx)
    if start_step == cfg.steps:  # resumed a finished run: nothing was sampled in this process
        return history, []
    batch = result.batch
    table = [
        {"prompt": result.prompts[i // cfg.group_size].prompt, "completion": text, **{n: float(batch.rewards[i, k]) for k, n in enumerate(batch.reward_names)}}
        for i, text in enumerate(result.texts)
    ]
    return history, table
