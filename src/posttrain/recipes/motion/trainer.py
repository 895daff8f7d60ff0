"""MotionInsight's two loops (specs §30): SFT of the evaluator on the annotated judgements, then GRPO with the
spec's reward (recipes/motion/reward.py), and the held-out evaluation both are scored by.

1. `train_sft`: teacher-forced cross-entropy on the fixed-format line of each training video (its annotation).
2. `train_grpo`: the core RL step (trainers/online_rl.py's `OnlineRL.step`) over the evaluator as a `Policy`
   (recipes/motion/policy.py): each step draws `videos_per_step` training videos, samples `group_size` judgements of
   each at `temperature` with their log-probs recorded, scores them (reward matrix [B, 3]: score accuracy, cause F1,
   format, weights 1, w_c, w_f), takes advantages from the registered estimator (`rl.advantage`, e.g. GRPO's group
   normalisation, Shao et al. 2024 eq. 3) and minimises the registered policy loss (`rl.loss`) plus beta times the
   k3 KL to the SFT model (Schulman 2020; GRPO's eq. 4 estimator), with the core's dynamic sampling, off-policy
   correction, epochs per batch, cosine schedule and diagnostics.
3. `evaluate`: greedy judgements of held-out videos: Spearman rank correlation of each predicted dimension with the
   annotated one, micro-F1 of the failure causes over (video, cause) pairs, format rate and mean reward.

Both loops checkpoint through trainers/loop.py (weights, optimiser, the batch draw and sampling generator, history,
RNG), so a killed run resumes bit-for-bit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from posttrain.recipes.motion.videos import CAUSES, DIMENSIONS, TRACK_FEATURES, Video, motion_representation, rgb_representation
from posttrain.config import RLConfig
from posttrain.recipes.motion.evaluator import PROMPT, MotionEvaluator
from posttrain.models.tokenizer import word_tokenizer
from posttrain.recipes.motion.policy import MAPS, TRACKS, EvaluatorPolicy, MotionTask
from posttrain.recipes.motion.reward import WORDS, cause_f1, motion_reward, parse, render
from posttrain.tasks import Example
from posttrain.trainers.loop import TrainLoop
from posttrain.trainers.online_rl import OnlineRL, RLRun, rl_of_section

REWARD_TERMS = ("score_accuracy", "cause_f1", "format")


@dataclass(frozen=True)
class VideoSet:
    maps: Tensor  # [N, T, C, S, S]
    tracks: Tensor  # [N, T, D]
    targets: Tensor  # [N, L] the annotation's line + end-of-text, padded
    target_mask: Tensor  # [N, L]
    scores: list[dict[str, float]]
    causes: list[tuple[str, ...]]

    def __len__(self) -> int:
        return len(self.scores)


def tokenizer():
    return word_tokenizer(WORDS)


def video_set(videos: list[Video], representation: str, slots: int, tok, pool: int = 1) -> VideoSet:
    """The evaluator's inputs for `videos`: the motion representation (flow, mask, tracks) or the RGB frames."""
    reps = [motion_representation(v.frames, slots) if representation == "motion" else rgb_representation(v.frames) for v in videos]
    lines = [tok(render(v.scores, v.causes)).input_ids + [tok.eos_token_id] for v in videos]
    width = max(len(x) for x in lines)
    targets = torch.tensor([x + [tok.pad_token_id] * (width - len(x)) for x in lines])
    mask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in lines])
    maps = torch.from_numpy(np.stack([r[0] for r in reps]))
    if pool > 1:  # the encoder reads the maps at size / pool (both representations alike)
        maps = F.avg_pool2d(maps.flatten(0, 1), pool).view(*maps.shape[:3], maps.shape[3] // pool, maps.shape[4] // pool)
    return VideoSet(maps, torch.from_numpy(np.stack([r[1] for r in reps])), targets, mask,
                    [v.scores for v in videos], [v.causes for v in videos])


def new_evaluator(cfg, representation: str, seed: int) -> MotionEvaluator:
    torch.manual_seed(seed)
    m = cfg.model
    spec = {"channels": 3, "track_dim": cfg.track_slots * TRACK_FEATURES if representation == "motion" else 0, "representation": representation,
            "encoder_width": m.encoder_width, "soft_tokens": m.soft_tokens, "hidden_size": m.hidden_size, "layers": m.layers, "heads": m.heads}
    return MotionEvaluator(spec, tokenizer())


def sft_loss(model: MotionEvaluator, data: VideoSet, idx: Tensor) -> Tensor:
    logits = model.token_logits(data.maps[idx], data.tracks[idx], data.targets[idx])
    nll = F.cross_entropy(logits.flatten(0, 1).float(), data.targets[idx].flatten(), reduction="none").view_as(logits[..., 0])
    mask = data.target_mask[idx].float()
    return (nll * mask).sum() / mask.sum()


def train_sft(cfg, model: MotionEvaluator, data: VideoSet, seed: int, loop: TrainLoop | None = None,
              on_log: Callable[[int, dict], None] | None = None) -> list[dict]:
    s, loop = cfg.sft, loop or TrainLoop()
    optimizer = torch.optim.AdamW(model.parameters(), lr=s.lr, weight_decay=0.0)
    draws = torch.Generator().manual_seed(seed)
    parts = {"optimizer": optimizer, "draws": draws}
    start, saved = loop.restore(model, parts)
    history = list(saved.get("history", []))
    model.train()
    for step in range(start + 1, s.steps + 1):
        idx = torch.randint(len(data), (s.batch_size,), generator=draws)
        loss = sft_loss(model, data, idx)
        loss.backward()
        grad_norm = loop.optimizer_step(step, loss, list(model.parameters()), optimizer, s.max_grad_norm)
        if step % s.log_every == 0 or step == s.steps:
            history.append({"step": step, "loss": float(loss.detach()), "grad_norm": grad_norm})
            if on_log:
                on_log(step, {"loss": float(loss.detach()), "grad_norm": grad_norm})
        loop.checkpoint(step, s.steps, model, parts, {"history": history})
    return history


def rl_settings(r) -> RLConfig:
    """The rl settings of the core step for the `motion.rl` section: its keys shared with `rl` (`beta`: the k3 KL to
    the SFT evaluator), the reward's three terms weighted 1, w_cause, w_format, and a constant learning rate (as the
    recipe's own loop had) without warm-up."""
    weights = {"score_accuracy": 1.0, "cause_f1": r.w_cause, "format": r.w_format}
    rewards = tuple({"name": f"motion_{t}", "weight": weights[t]} for t in REWARD_TERMS)
    return rl_of_section(r, rewards=rewards, prompts_per_step=r.videos_per_step, warmup_steps=0, lr_schedule="constant")


def rl_trainer(cfg, model: MotionEvaluator, data: VideoSet, seed: int, loop: TrainLoop | None = None) -> tuple[OnlineRL, list[Example]]:
    """The core RL trainer over the evaluator (its `EvaluatorPolicy`; the reference is a frozen copy of it as it starts)
    and the training videos as examples."""
    r, loop = cfg.rl, loop or TrainLoop()
    examples = [Example(prompt=PROMPT, completion="", answer="", metadata={"video": i, MAPS: data.maps[i], TRACKS: data.tracks[i]})
                for i in range(len(data))]
    task = MotionTask(data.scores, data.causes, r.w_cause, r.w_format)
    run = RLRun(policy=model, tokenizer=model.tokenizer, task=task, examples=examples, cfg=rl_settings(r), seed=seed,
                checkpoint_dir=loop.checkpoint_dir, config_hash=loop.config_hash, adapter=EvaluatorPolicy(model))
    return OnlineRL(run, loop=loop), examples


def train_grpo(cfg, model: MotionEvaluator, data: VideoSet, seed: int, loop: TrainLoop | None = None,
               on_log: Callable[[int, dict], None] | None = None) -> list[dict]:
    """GRPO through the core RL step; each step's videos are drawn (with replacement) from a checkpointed generator."""
    r, loop = cfg.rl, loop or TrainLoop()
    trainer, examples = rl_trainer(cfg, model, data, seed, loop)
    draws = torch.Generator().manual_seed(seed + 1)
    parts = {"trainer": trainer, "draws": draws}
    start, saved = loop.restore(model, parts)
    history = list(saved.get("history", []))
    draw = lambda n: [examples[i] for i in torch.randint(len(examples), (n,), generator=draws).tolist()]  # noqa: E731
    model.train()
    for step in range(start + 1, r.steps + 1):
        result = trainer.step(draw(r.videos_per_step), more_prompts=draw)
        batch, metrics = result.batch, result.metrics
        total = batch.rewards @ batch.reward_weights
        row = {"step": step, **metrics, "reward": float(total.mean()), "kl": metrics.get("kl", 0.0),
               **{k: float(batch.rewards[:, i].mean()) for i, k in enumerate(REWARD_TERMS)},
               "reward_std_in_group": float(total.view(-1, r.group_size).std(1).mean())}
        if step % r.log_every == 0 or step == r.steps:
            history.append(row)
            if on_log:
                on_log(step, {k: v for k, v in row.items() if k != "step"})
        loop.checkpoint(step, r.steps, model, parts, {"history": history})
    return history


@torch.no_grad()
def predict(model: MotionEvaluator, data: VideoSet, max_new_tokens: int, batch_size: int = 64) -> list[str]:
    model.eval()
    texts = []
    for i in range(0, len(data), batch_size):
        ids, mask = model.generate(data.maps[i: i + batch_size], data.tracks[i: i + batch_size], max_new_tokens)
        texts += model.decode(ids, mask)
    return texts


def spearman(a, b) -> float:
    """Spearman's rank correlation (0 when either side is constant: no ranking to agree with)."""
    from scipy.stats import spearmanr

    if np.std(a) == 0 or np.std(b) == 0:
        return 0.0
    return float(spearmanr(a, b).statistic)


def evaluate(model: MotionEvaluator, data: VideoSet, cfg) -> tuple[dict[str, float], list[dict]]:
    """(held-out metrics, one row per video: its annotation, the judgement written and its reward)."""
    texts = predict(model, data, cfg.rl.max_new_tokens)
    judged = [parse(t) for t in texts]
    metrics = {}
    for d in DIMENSIONS:  # an unparseable judgement counts as the scale's midpoint
        metrics[f"rho_{d}"] = spearman([j.scores[d] if j else 0.5 for j in judged], [s[d] for s in data.scores])
    metrics["rho_mean"] = float(np.mean([metrics[f"rho_{d}"] for d in DIMENSIONS]))
    tp = fp = fn = 0
    for j, true in zip(judged, data.causes):
        predicted = set(j.causes) if j else set()
        tp, fp, fn = tp + len(predicted & set(true)), fp + len(predicted - set(true)), fn + len(set(true) - predicted)
    metrics["cause_f1"] = 2 * tp / max(1, 2 * tp + fp + fn)
    rewards = [motion_reward(t, s, c, cfg.rl.w_cause, cfg.rl.w_format) for t, s, c in zip(texts, data.scores, data.causes)]
    metrics.update(format_rate=float(np.mean([r["format"] for r in rewards])), reward=float(np.mean([r["reward"] for r in rewards])),
                   video_cause_f1=float(np.mean([cause_f1(j.causes if j else (), c) for j, c in zip(judged, data.causes)])))
    for c in CAUSES:
        metrics[f"recall_{c}"] = float(np.mean([c in (j.causes if j else ()) for j, t in zip(judged, data.causes) if c in t] or [0.0]))
    table = [{"video": i, "true": render(s, c), "predicted": t, "reward": r["reward"]}
             for i, (t, s, c, r) in enumerate(zip(texts, data.scores, data.causes, rewards))]
    return metrics, table
