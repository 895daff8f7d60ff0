"""Offline preference training: a policy learns from (prompt, chosen, rejected) pairs with the objective named
by `preference.objective` (DPO and its relatives, objectives/preference.py).

The reference is the policy as it starts (the SFT model): its sequence log-probs of every pair are computed
once, before the first update, so no second model is kept in memory. Each step samples `batch_size` pairs;
an objective registered with `gold_rows=True` (ABC-Align) also gets the human-labelled pairs appended, with
the sampled rows' human labels hidden, so it sees the pool and the labelled subset side by side.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from posttrain.data.preferences import PreferencePair
from posttrain.models.logprobs import completion_logprobs
from posttrain.objectives.preference import PairLogps, preference_objectives
from posttrain.rollout.sampling import encode_prompts
from posttrain.models.tokenizer import check_vocabulary
from posttrain.runtime import progress
from posttrain.trainers.common import optimizer_and_schedule
from posttrain.trainers.loop import TrainLoop

EVAL_CHUNK = 256  # pairs per no-grad forward pass


@dataclass(frozen=True)
class EncodedPairs:
    """Rows 2i and 2i+1 are pair i's chosen and rejected response after the same left-padded prompt."""

    prompt_ids: Tensor  # [2N, P]
    prompt_mask: Tensor  # [2N, P]
    completion_ids: Tensor  # [2N, T] right-padded response + EOS
    completion_mask: Tensor  # [2N, T]
    severity: Tensor  # [N]
    gold: Tensor  # [N] 1 / 0 / NaN

    def rows(self, pairs: Tensor) -> "EncodedPairs":
        rows = torch.stack([2 * pairs, 2 * pairs + 1], dim=1).flatten()
        return EncodedPairs(
            self.prompt_ids[rows], self.prompt_mask[rows], self.completion_ids[rows], self.completion_mask[rows],
            self.severity[pairs], self.gold[pairs],
        )

    def __len__(self) -> int:
        return self.severity.shape[0]


def encode_pairs(tokenizer: PreTrainedTokenizerBase, pairs: Sequence[PreferencePair], device: torch.device) -> EncodedPairs:
    prompts = [p.prompt for p in pairs for _ in range(2)]
    prompt_ids, prompt_mask = encode_prompts(tokenizer, prompts, device)
    responses = [tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id] for p in pairs for text in (p.chosen, p.rejected)]
    width = max(map(len, responses))
    completion_ids = torch.full((len(responses), width), tokenizer.pad_token_id, dtype=torch.long)
    completion_mask = torch.zeros((len(responses), width), dtype=torch.long)
    for i, ids in enumerate(responses):
        completion_ids[i, : len(ids)] = torch.tensor(ids)
        completion_mask[i, : len(ids)] = 1
    severity = torch.tensor([p.severity for p in pairs], dtype=torch.float32)
    gold = torch.tensor([math.nan if p.gold is None else float(p.gold) for p in pairs], dtype=torch.float32)
    return EncodedPairs(prompt_ids, prompt_mask, completion_ids.to(device), completion_mask.to(device), severity.to(device), gold.to(device))


def sequence_logps(model: PreTrainedModel, enc: EncodedPairs) -> tuple[Tensor, Tensor]:
    """(chosen, rejected) sequence log-probs [N] each: sums over response tokens (EOS included)."""
    logp, _ = completion_logprobs(model, enc.prompt_ids, enc.prompt_mask, enc.completion_ids, enc.completion_mask)
    per_row = (logp * enc.completion_mask).sum(-1)
    return per_row[0::2], per_row[1::2]


@torch.no_grad()
def all_sequence_logps(model: PreTrainedModel, enc: EncodedPairs) -> tuple[Tensor, Tensor]:
    was_training = model.training
    model.eval()
    parts = [sequence_logps(model, enc.rows(torch.arange(s, min(s + EVAL_CHUNK, len(enc)), device=enc.severity.device))) for s in range(0, len(enc), EVAL_CHUNK)]
    model.train(was_training)
    return torch.cat([c for c, _ in parts]), torch.cat([r for _, r in parts])


def heldout_metrics(model: PreTrainedModel, enc: EncodedPairs, ref: tuple[Tensor, Tensor], beta: float) -> dict[str, float]:
    """Held-out pair accuracy of the implicit reward beta * (log pi - log pi_ref), and of log pi alone."""
    chosen, rejected = all_sequence_logps(model, enc)
    implicit = (chosen - ref[0]) - (rejected - ref[1])
    return {
        "heldout_pair_accuracy": float((implicit > 0).float().mean()),
        "heldout_logp_pair_accuracy": float((chosen > rejected).float().mean()),
        "heldout_reward_margin": float(beta * implicit.mean()),
    }


def train_preference(
    policy: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, train: Sequence[PreferencePair], heldout: Sequence[PreferencePair],
    cfg, seed: int, on_log: Callable[[int, dict[str, float]], None], loop: TrainLoop | None = None,
) -> tuple[list[dict[str, float]], dict[str, float]]:
    """Train `policy` in place on `train` pairs with `cfg.objective` (a PreferenceConfig); return the logged
    history and the held-out pair metrics after training (with `_before` twins measured at the start, and
    `nonfinite_steps`). `loop` (trainers/loop.py) guards each step and, in a stage, checkpoints and resumes; the
    objective's state (ABC-Align's alpha EMA) is checkpointed with the history."""
    loop = loop or TrainLoop()
    check_vocabulary(tokenizer, [t for p in [*train, *heldout] for t in (p.prompt, p.chosen, p.rejected)], "the preference data")
    device = next(policy.parameters()).device
    entry = preference_objectives.entry(cfg.objective)
    enc, held = encode_pairs(tokenizer, train, device), encode_pairs(tokenizer, heldout, device)
    ref, held_ref = all_sequence_logps(policy, enc), all_sequence_logps(policy, held)
    before = {f"{k}_before": v for k, v in heldout_metrics(policy, held, held_ref, cfg.beta).items()}
    gold_rows = torch.nonzero(~torch.isnan(enc.gold)).squeeze(-1) if entry.meta.get("gold_rows") else None
    params = [p for p in policy.parameters() if p.requires_grad]
    optimizer, schedule = optimizer_and_schedule(params, cfg.lr, 0.0, cfg.warmup_steps, cfg.steps)
    generator = torch.Generator().manual_seed(seed)
    parts = {"optimizer": optimizer, "schedule": schedule, "generator": generator}
    start, saved = loop.restore(policy, parts)  # after the reference log-probs: those are the starting policy's
    state: dict = saved.get("objective_state", {})
    history: list[dict[str, float]] = saved.get("history", [])
    policy.train()
    bar = progress(cfg.steps, f"preference ({cfg.objective})", initial=start)
    for step in range(start + 1, cfg.steps + 1):
        picked = torch.randint(len(enc), (min(cfg.batch_size, len(enc)),), generator=generator).to(device)
        gold = torch.full_like(enc.gold[picked], math.nan) if gold_rows is not None else enc.gold[picked]
        if gold_rows is not None and gold_rows.numel():
            labelled = gold_rows[torch.randperm(gold_rows.numel(), generator=generator)[: cfg.batch_size].to(device)]
            picked, gold = torch.cat([picked, labelled]), torch.cat([gold, enc.gold[labelled]])
        chosen, rejected = sequence_logps(policy, enc.rows(picked))
        pairs = PairLogps(chosen, rejected, ref[0][picked], ref[1][picked], enc.severity[picked], gold)
        loss, metrics = entry.obj(pairs, cfg, state)
        loss.backward()
        grad_norm = loop.optimizer_step(step, loss, params, optimizer, cfg.max_grad_norm)
        schedule.step()
        bar.update()
        if step % cfg.log_every == 0 or step == cfg.steps:
            metrics.update(loss=float(loss.detach()), grad_norm=grad_norm, lr=schedule.get_last_lr()[0])
            metrics.update(heldout_metrics(policy, held, held_ref, cfg.beta))
            history.append({"step": float(step), **metrics})
            on_log(step, metrics)
            bar.set_postfix(loss=f"{metrics['loss']:.3f}")
        loop.checkpoint(step, cfg.steps, policy, parts, {"history": history, "objective_state": state})
    bar.close()
    return history, {**before, **heldout_metrics(policy, held, held_ref, cfg.beta), **loop.metrics()}
