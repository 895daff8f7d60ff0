"""Pretraining a success critic for RFPO (Reward-Free Policy Optimization, 2026): V_psi(s_t) ~ P(success | x, y_<=t) from labelled rollouts.

The SFT policy samples `critic.samples_per_prompt` completions of each of `critic.n_prompts` training prompts (the
rl budget and temperature, so the critic sees the rollouts RL will start from); the prompts are a seeded uniform draw
from the whole training split, the distribution RL draws its prompts from. (The first n_prompts would be the SFT
stage's examples, `sft.n_examples` of them from the top: answers the policy memorised, solved far more often than
the prompts RL meets, so a critic trained on them learns that the policy succeeds and is overconfident everywhere
else.) The task's verifier labels each
rollout 1 (solved) or 0. The critic (a value head on a copy of the policy, models/value.py) regresses every state of
the rollout, s_0 (the prompt) through s_L (after the last token), on its eventual label with a squared error, whose
minimiser is the conditional success probability. This is the only place labels are read; RL with preset `rfpo`
then reads the frozen critic alone. Held-out figures: the Brier score of V(s_L) on held-out prompts' rollouts, the
base rate's Brier score (a constant predictor), and the AUC of V(s_L) for telling solved from failed rollouts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from posttrain.eval.best_of_n import auc
from posttrain.rollout.sampling import generate
from posttrain.models.value import critic_from_policy, state_values
from posttrain.tasks import Example, Task
from posttrain.trainers.common import optimizer_and_schedule
from posttrain.trainers.loop import TrainLoop


@dataclass(frozen=True)
class Labelled:
    prompt_ids: Tensor
    prompt_mask: Tensor
    completion_ids: Tensor
    attention_mask: Tensor
    labels: Tensor  # [N] 1.0 solved, 0.0 not

    def rows(self, index: Tensor) -> "Labelled":
        return Labelled(*(getattr(self, f)[index] for f in ("prompt_ids", "prompt_mask", "completion_ids", "attention_mask", "labels")))


@torch.no_grad()
def labelled_rollouts(policy, tokenizer, task: Task, examples: Sequence[Example], samples: int, max_new_tokens: int, temperature: float,
                      generator: torch.Generator) -> Labelled:
    """`samples` rollouts of each example by `policy`, labelled by the task's verifier."""
    from posttrain.rollout.sampling import encode_prompts

    out, texts = generate(policy, tokenizer, list(examples), max_new_tokens, group_size=samples, temperature=temperature, generator=generator)
    rows = [e for e in examples for _ in range(samples)]
    labels = torch.tensor([task.correctness_reward(t, f, e) >= 1.0 for t, f, e in zip(texts, out.finished.tolist(), rows)], dtype=torch.float32)
    ids, mask = encode_prompts(tokenizer, list(examples), out.completion_ids.device)
    return Labelled(ids.repeat_interleave(samples, 0), mask.repeat_interleave(samples, 0), out.completion_ids, out.attention, labels.to(ids.device))


def state_mask(attention_mask: Tensor) -> Tensor:
    """[N, T + 1] 1 on the states s_0 .. s_L of each row (L = its real completion tokens)."""
    lengths = attention_mask.sum(-1)
    return (torch.arange(attention_mask.shape[1] + 1, device=attention_mask.device)[None] <= lengths[:, None]).to(torch.float32)


def success_loss(critic, data: Labelled) -> Tensor:
    """Mean over rollouts and their states of (V(s_t) - label)^2."""
    values = state_values(critic, data.prompt_ids, data.prompt_mask, data.completion_ids, data.attention_mask)
    m = state_mask(data.attention_mask)
    return (((values - data.labels[:, None]) ** 2) * m).sum() / m.sum()


@torch.no_grad()
def heldout_metrics(critic, data: Labelled) -> dict[str, float]:
    from posttrain.models.value import final_values

    critic.eval()
    v = final_values(state_values(critic, data.prompt_ids, data.prompt_mask, data.completion_ids, data.attention_mask), data.attention_mask)
    critic.train()
    rate = float(data.labels.mean())
    return {"heldout_brier": float(((v.clamp(0, 1) - data.labels) ** 2).mean()), "heldout_brier_base_rate": rate * (1 - rate),
            "heldout_auc": auc(v, data.labels), "heldout_success_rate": rate, "heldout_value_mean": float(v.mean())}


def critic_prompts(train: Sequence[Example], n: int, seed: int) -> list[Example]:
    """`n` training prompts drawn uniformly without replacement (seeded), in the order drawn."""
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed + 2))[:n]
    return [train[i] for i in order.tolist()]


def train_critic(policy, tokenizer, task: Task, train: Sequence[Example], heldout: Sequence[Example], cfg, seed: int, loop: TrainLoop,
                 on_log: Callable[[int, dict[str, float]], None]):
    """(the trained critic, its metric history, the final metrics) under `cfg.critic` (the rl budget for rollouts)."""
    opts, rl = cfg.critic, cfg.rl
    generator = torch.Generator(device=next(policy.parameters()).device).manual_seed(seed)
    policy.eval()
    data = labelled_rollouts(policy, tokenizer, task, critic_prompts(train, opts.n_prompts, seed), opts.samples_per_prompt, rl.max_new_tokens,
                             rl.temperature, generator)
    held = labelled_rollouts(policy, tokenizer, task, list(heldout[: opts.n_heldout_prompts]), opts.samples_per_prompt, rl.max_new_tokens,
                             rl.temperature, generator)
    critic = critic_from_policy(policy).train()
    optimizer, schedule = optimizer_and_schedule(critic.parameters(), opts.lr, 0.0, opts.warmup_steps, opts.steps)
    draw = torch.Generator().manual_seed(seed + 1)  # minibatch order; checkpointed
    parts = {"optimizer": optimizer, "schedule": schedule, "draw": draw}
    start, saved = loop.restore(critic, parts)
    history: list[dict[str, float]] = saved.get("history", [])
    for step in range(start + 1, opts.steps + 1):
        index = torch.randint(len(data.labels), (min(opts.batch_size, len(data.labels)),), generator=draw).to(data.labels.device)
        loss = success_loss(critic, data.rows(index))
        loss.backward()
        grad_norm = loop.optimizer_step(step, loss, list(critic.parameters()), optimizer, opts.max_grad_norm)
        schedule.step()
        metrics = {"loss": float(loss.detach()), "grad_norm": grad_norm, "lr": schedule.get_last_lr()[0], "nonfinite_steps": float(loop.nonfinite_steps)}
        if step % opts.log_every == 0 or step == opts.steps:
            metrics.update(heldout_metrics(critic, held))
            on_log(step, metrics)
        history.append(metrics)
        loop.checkpoint(step, opts.steps, critic, parts, {"history": history})
    final = {**heldout_metrics(critic, held), "train_success_rate": float(data.labels.mean()), "n_rollouts": float(len(data.labels)),
             "nonfinite_steps": float(loop.nonfinite_steps)}
    return critic.eval(), history, final
