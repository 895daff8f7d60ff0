"""Online RL: sample G completions per prompt, score them, estimate advantages, take a policy step.

The objective is whatever `rl.advantage` / `rl.loss` / `rl.loss_agg` name in their registries; this loop
only computes what the chosen parts declare they need (e.g. reference log-probs only when beta > 0).
"""

from __future__ import annotations

import copy
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from posttrain.config import RLConfig
from posttrain.models.logprobs import completion_logprobs
from posttrain.objectives import advantages, aggregations, losses, needs_of
from posttrain.objectives.kl import k3_kl
from posttrain.rewards import reward_matrix
from posttrain.rollout import RolloutBatch
from posttrain.rollout.engine import sample
from posttrain.rollout.text import decode_completions
from posttrain.tasks import Example, Task
from posttrain.trainers.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from posttrain.trainers.common import encode_prompts, optimizer_and_schedule, progress


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


def rollout(run: RLRun, prompts: list[Example], generator: torch.Generator) -> tuple[RolloutBatch, list[str], dict[str, float]]:
    """Sample, decode and score one batch of prompts; returns the batch, the texts and rollout metrics."""
    cfg, tok = run.cfg, run.tokenizer
    device = next(run.policy.parameters()).device
    prompt_ids, prompt_mask = encode_prompts(tok, [e.prompt for e in prompts], device)
    start = time.perf_counter()
    samples = sample(
        run.policy, prompt_ids, prompt_mask, group_size=cfg.group_size, max_new_tokens=cfg.max_new_tokens,
        eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, temperature=cfg.temperature, generator=generator,
    )
    seconds = time.perf_counter() - start
    texts = decode_completions(tok, samples)
    expanded = [e for e in prompts for _ in range(cfg.group_size)]
    rewards, names, weights = reward_matrix(cfg.rewards, run.task, expanded, texts, samples.finished.tolist())
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


def reward_metrics(batch: RolloutBatch) -> dict[str, float]:
    metrics = {}
    for k, name in enumerate(batch.reward_names):
        column = batch.rewards[:, k]
        metrics[f"reward/{name}_mean"] = float(column.mean())
        metrics[f"reward/{name}_std"] = float(column.std()) if column.numel() > 1 else 0.0
    total = batch.rewards @ batch.reward_weights
    metrics["reward/total_mean"] = float(total.mean())
    if "correctness" in batch.reward_names:
        metrics["accuracy"] = metrics["reward/correctness_mean"]
    return metrics


def policy_step(
    run: RLRun, prompts: list[Example], generator: torch.Generator, optimizer, schedule, reference: PreTrainedModel | None = None
) -> tuple[RolloutBatch, list[str], dict[str, float]]:
    """One update on `prompts`: rollout, rewards, advantages, `epochs_per_batch` policy passes (an optimizer step
    each) and one schedule step; returns the batch, the completion texts and the step's metrics."""
    cfg, policy = run.cfg, run.policy
    estimate = advantages.get(cfg.advantage)
    policy_loss = losses.get(cfg.loss)
    aggregate = aggregations.get(cfg.loss_agg)
    batch, texts, metrics = rollout(run, prompts, generator)
    if reference is not None:
        with torch.no_grad():
            ref_logp, _ = completion_logprobs(reference, batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask, cfg.temperature)
        batch = batch.with_extras(ref_logp=ref_logp)
    adv = estimate(batch, cfg)
    for _ in range(cfg.epochs_per_batch):
        logp, entropy = completion_logprobs(
            policy, batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask, cfg.temperature, with_entropy=True
        )
        loss, loss_metrics = policy_loss(logp, batch.old_logp, adv, batch.completion_mask, cfg)
        if cfg.beta > 0:
            kl = aggregate(k3_kl(logp, batch.extras["ref_logp"]), batch.completion_mask)
            loss = loss + cfg.beta * kl
            loss_metrics["kl"] = float(kl)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    schedule.step()
    metrics.update(reward_metrics(batch))
    metrics.update(loss_metrics)
    metrics.update(
        loss=float(loss), grad_norm=float(grad_norm), lr=schedule.get_last_lr()[0],
        entropy=float(aggregate(entropy, batch.completion_mask)), advantage_abs_mean=float(adv.abs().mean()),
    )
    return batch, texts, metrics


def train_online_rl(
    run: RLRun, resume: bool, on_log: Callable[[int, dict[str, float]], None]
) -> tuple[list[dict[str, float]], list[dict[str, object]]]:
    """Run `cfg.steps` policy updates; return the per-step metric history (restored on resume) and a
    table of the last step's completions."""
    cfg, policy = run.cfg, run.policy
    device = next(policy.parameters()).device
    needs = needs_of(cfg)
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
        state = load_checkpoint(found, policy, run.config_hash)
        if reference is not None:
            reference.load_state_dict(state["reference"])
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        stream = PromptStream(run.examples, run.seed, **state["stream"])
        generator.set_state(state["generator"])
        history = state["history"]
        start_step = state["step"]

    policy.train()
    bar = progress(cfg.steps, f"rl ({cfg.advantage}+{cfg.loss})", initial=start_step)
    for step in range(start_step + 1, cfg.steps + 1):
        prompts = stream.take(cfg.prompts_per_step)
        batch, texts, metrics = policy_step(run, prompts, generator, optimizer, schedule, reference)
        history.append(metrics)
        bar.update()
        bar.set_postfix(acc=f"{metrics.get('accuracy', float('nan')):.2f}")
        if step % cfg.log_every == 0 or step == cfg.steps:
            on_log(step, metrics)
        if cfg.checkpoint_every and step % cfg.checkpoint_every == 0 and step < cfg.steps:
            save_checkpoint(
                run.checkpoint_dir, step, policy,
                {
                    "optimizer": optimizer.state_dict(), "schedule": schedule.state_dict(), "stream": stream.state(),
                    "generator": generator.get_state(), "history": history, "config_hash": run.config_hash,
                    "reference": reference.state_dict() if reference is not None else None,
                },
            )
    bar.close()
    table = [
        {"prompt": prompts[i // cfg.group_size].prompt, "completion": texts[i], **{n: float(batch.rewards[i, k]) for k, n in enumerate(batch.reward_names)}}
        for i in range(len(texts))
    ] if start_step < cfg.steps else []
    return history, table
