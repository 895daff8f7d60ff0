"""VLM-Safe-RL's two loops (specs §16): the contrastive image-text encoder, then PPO-Lagrangian over its frozen
embeddings in the driving environment (recipes/safe_rl/driving.py; the objective: recipes/safe_rl/objective.py).

1. `train_encoder`: a tiny CLIP (models/image_text.py) learns from a random driver's frames and the captions of
   their states (recipes/safe_rl/driving.py `captions`). Each frame is paired with one of its phrases (or the whole caption),
   drawn per step, and the loss is CLIP's symmetric InfoNCE (Radford et al. 2021, Fig. 3; van den Oord et al.
   2018) with every text of the batch that describes a frame counted as its positive (the multi-positive form of
   Khosla et al. 2020, eq. 2): frames of the same situation are not pushed apart. The safe / danger prompts are
   captions of the danger phrase, so s_t reads what the encoder learnt about "about to crash".
2. `SafeRL`: each round rolls out `envs` episodes with the sampling policy (frame -> frozen embedding, with the
   ego features -> action), moves the multiplier on the round's cost and VLM risk, then runs `epochs` passes of
   PPO-Lagrangian minibatches. Rounds are checkpointed through trainers/loop.py (agent, optimiser, multiplier,
   history, RNG); a round's episodes are seeded by (seed, round), so a resumed run draws the same traffic.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from posttrain.recipes.safe_rl.driving import ACTIONS, CRASH, EXIT, N_FEATURES, SAFE, DrivingEnv, vocabulary
from posttrain.recipes.safe_rl.policy import DrivingAgent
from posttrain.models.image_text import ImageTextEncoder, tiny_clip
from posttrain.models.tokenizer import check_vocabulary
from posttrain.recipes.safe_rl.objective import (LagrangeMultiplier, advantages, episode_cost, ppo_lagrangian_loss, safety_score,
                                                 shaped_reward, violation)
from posttrain.trainers.loop import NumpyDraws, TrainLoop

BEHAVIOUR = np.array([0.4, 0.12, 0.12, 0.18, 0.18])  # the random driver's action probabilities (keep, left, right, faster, slower)
HELDOUT_SEED = 10**6  # the episodes of the held-out frames and of the final evaluation are drawn apart from training's


# -- 1. the encoder ----------------------------------------------------------------------------------------------
def random_driver_frames(env_cfg, n_frames: int, seed: int) -> tuple[np.ndarray, list[list[str]]]:
    """`n_frames` frames [F, S, S, 3] of a random driver's episodes and the caption phrases of each state."""
    rng, frames, captions, k = np.random.default_rng([seed, 1]), [], [], 0
    while sum(len(f) for f in frames) < n_frames:
        env = DrivingEnv(env_cfg, 64, [seed, 2, k])
        while not env.done.all():
            alive = ~env.done
            frames.append(env.render()[alive])
            captions += [c for c, a in zip(env.captions(), alive) if a]
            env.step(rng.choice(len(ACTIONS), size=env.n, p=BEHAVIOUR))
        k += 1
    return np.concatenate(frames)[:n_frames], captions[:n_frames]


def positives(texts: list[str], captions: list[list[str]]) -> torch.Tensor:
    """[B, B] 1 where text j describes frame i (one of its phrases, or its whole caption)."""
    described = [set(c) | {" ".join(c)} for c in captions]
    return torch.tensor([[float(t in d) for t in texts] for d in described])


def multi_positive_infonce(image: torch.Tensor, text: torch.Tensor, positive: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Symmetric InfoNCE over unit embeddings [B, D] with the positive matrix [B, B] (each row and column has one)."""
    logits = scale * image @ text.T
    i2t = -(positive / positive.sum(1, keepdim=True) * F.log_softmax(logits, dim=1)).sum(1).mean()
    t2i = -(positive / positive.sum(0, keepdim=True) * F.log_softmax(logits, dim=0)).sum(0).mean()
    return (i2t + t2i) / 2


def train_encoder(cfg, seed: int, loop: TrainLoop | None = None, on_log: Callable[[int, dict], None] | None = None):
    """(the trained CLIPModel, its tokenizer, held-out figures) for settings `cfg` (the safe_rl section)."""
    e = cfg.encoder
    torch.manual_seed(seed)
    model, tokenizer = tiny_clip(vocabulary(), cfg.env.image_size, e.patch_size, e.hidden_size, e.layers, e.heads, e.embed_dim)
    frames, captions = random_driver_frames(cfg.env, e.n_frames, seed)
    view = ImageTextEncoder(model, tokenizer)
    model.train().requires_grad_(True)  # trained here; frozen by ImageTextEncoder.load afterwards
    optimizer = torch.optim.AdamW(model.parameters(), lr=e.lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / (e.warmup_steps + 1)))
    loop, rng = loop or TrainLoop(), np.random.default_rng([seed, 3])
    parts = {"optimizer": optimizer, "schedule": schedule, "draw": NumpyDraws(rng)}
    start, saved = loop.restore(model, parts)
    history: list[dict] = saved.get("history", [])
    pixels = view.pixels(frames)
    for step in range(start + 1, e.steps + 1):
        idx = rng.choice(len(frames), size=min(e.batch_size, len(frames)), replace=False)
        chosen = [captions[i] for i in idx]
        texts = [" ".join(c) if (pick := rng.integers(len(c) + 1)) == len(c) else c[pick] for c in chosen]
        loss = multi_positive_infonce(view.image_features(pixels[idx]), view.text_features(texts), positives(texts, chosen),
                                      model.logit_scale.exp().clamp(max=100.0))
        loss.backward()
        grad_norm = loop.optimizer_step(step, loss, list(model.parameters()), optimizer, e.max_grad_norm)
        schedule.step()
        if step % e.log_every == 0 or step == e.steps:
            history.append({"step": step, "loss": float(loss.detach()), "grad_norm": grad_norm})
            if on_log:
                on_log(step, history[-1])
        loop.checkpoint(step, e.steps, model, parts, {"history": history})
    frozen = ImageTextEncoder(model, tokenizer)
    return model, tokenizer, {**encoder_figures(frozen, cfg, seed), "loss": history[-1]["loss"], **loop.metrics()}, history


def encoder_figures(encoder: ImageTextEncoder, cfg, seed: int) -> dict[str, float]:
    """On held-out frames: accuracy of picking the right one of the three danger phrases (safe / crash / exit), and
    the mean safety score s of the frames captioned safe and of those captioned about to crash (their gap > 0:
    the score tells them apart)."""
    frames, captions = random_driver_frames(cfg.env, cfg.encoder.n_heldout, seed + HELDOUT_SEED)
    images = encoder.embed_images(frames)
    phrases = [SAFE, CRASH, EXIT]
    truth = torch.tensor([phrases.index(c[0]) for c in captions])
    picked = (images @ encoder.embed_texts(phrases).T).argmax(1)
    prompts = encoder.embed_texts([cfg.safe_prompt, cfg.danger_prompt])
    score = safety_score(images, prompts[0], prompts[1])
    safe, crash = score[truth == 0], score[truth == 1]
    mean = lambda t: float(t.mean()) if len(t) else math.nan  # noqa: E731
    return {"danger_phrase_accuracy": float((picked == truth).float().mean()), "score_safe_frames": mean(safe),
            "score_crash_frames": mean(crash), "score_gap": mean(safe) - mean(crash), "crash_frame_share": float((truth == 1).float().mean())}


# -- 2. PPO-Lagrangian -------------------------------------------------------------------------------------------
@dataclass
class Rollout:
    x: torch.Tensor  # [E, T, D + 3] policy inputs
    actions: torch.Tensor  # [E, T]
    logp: torch.Tensor  # [E, T]
    values_r: torch.Tensor  # [E, T]
    values_c: torch.Tensor
    rewards: torch.Tensor  # [E, T] environment reward (progress), 0 after the end
    costs: torch.Tensor  # [E, T]
    score: torch.Tensor  # [E, T] the VLM safety score s_t
    mask: torch.Tensor  # [E, T] 1 while the episode runs
    progress: torch.Tensor  # [E]
    collisions: torch.Tensor  # [E]
    exits: torch.Tensor  # [E]
    frames: np.ndarray | None = None  # [T, S, S, 3] of episode 0 (kept on request)


def episode_figures(ro: Rollout, cfg) -> dict[str, float]:
    """Catastrophe rate (share of episodes with a collision or a road exit), cost, progress, ... of a rollout."""
    total_cost = ro.costs.sum(1)
    return {"catastrophe_rate": float((total_cost > 0).float().mean()), "cost": float(total_cost.mean()),
            "cost_normalised": float(episode_cost(ro.costs, ro.progress, "progress", cfg.p_min).mean()),
            "collisions": float(ro.collisions.mean()), "road_exits": float(ro.exits.mean()), "progress": float(ro.progress.mean()),
            "return": float(ro.rewards.sum(1).mean()), "episode_length": float(ro.mask.sum(1).mean()),
            "safety_score": float((ro.score * ro.mask).sum() / ro.mask.sum())}


class SafeRL:
    """The agent, its optimiser and the multiplier, over a frozen encoder (settings: the safe_rl section)."""

    def __init__(self, cfg, encoder: ImageTextEncoder, seed: int):
        self.cfg, self.encoder, self.seed = cfg, encoder, seed
        torch.manual_seed(seed)
        self.agent = DrivingAgent(encoder.dim + N_FEATURES, cfg.hidden_size, len(ACTIONS))
        self.optimizer = torch.optim.Adam(self.agent.parameters(), lr=cfg.lr, eps=1e-5)
        self.multiplier = LagrangeMultiplier(cfg.lambda_init, cfg.lambda_lr if cfg.lagrangian else 0.0)
        check_vocabulary(encoder.tokenizer, [cfg.safe_prompt, cfg.danger_prompt], "safe_rl.safe_prompt / safe_rl.danger_prompt")
        self.prompts = encoder.embed_texts([cfg.safe_prompt, cfg.danger_prompt])

    def parts(self) -> dict:
        return {"optimizer": self.optimizer, "multiplier": self.multiplier}

    def observe(self, env: DrivingEnv) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
        """(policy input [N, D + 3], safety score [N], frames) of the current state."""
        frames = env.render()
        emb = self.encoder.embed_images(frames)
        self.encoder.assert_frozen(emb)
        return torch.cat([emb, torch.from_numpy(env.features())], dim=1), safety_score(emb, *self.prompts), frames

    @torch.no_grad()
    def rollout(self, n: int, env_seed, greedy: bool = False, keep_frames: bool = False) -> Rollout:
        env, cols = DrivingEnv(self.cfg.env, n, env_seed), {k: [] for k in ("x", "a", "logp", "vr", "vc", "r", "c", "s", "m")}
        frames, collisions, exits = [], np.zeros(n), np.zeros(n)
        while not env.done.all():
            x, score, frame = self.observe(env)
            dist = self.agent.distribution(x)
            action = dist.probs.argmax(-1) if greedy else dist.sample()
            v_r, v_c = self.agent.values(x)
            step = env.step(action.numpy())
            if keep_frames and step.alive[0]:
                frames.append(frame[0])
            collisions += step.collision
            exits += step.road_exit
            for key, value in zip(cols, (x, action, dist.log_prob(action), v_r, v_c, step.reward, step.cost, score, step.alive)):
                cols[key].append(torch.as_tensor(value, dtype=torch.float32) if key not in ("x", "a") else value)
        stack = lambda key: torch.stack(cols[key], dim=1)  # noqa: E731
        mask = stack("m")
        return Rollout(stack("x"), stack("a"), stack("logp"), stack("vr") * mask, stack("vc") * mask, stack("r"), stack("c"),
                       stack("s") * mask, mask, torch.from_numpy(env.progress()).float(), torch.from_numpy(collisions).float(),
                       torch.from_numpy(exits).float(), np.stack(frames) if frames else None)

    def round(self, iteration: int, loop: TrainLoop) -> dict[str, float]:
        """One rollout, the multiplier update, then PPO-Lagrangian epochs; the round's figures."""
        cfg = self.cfg
        ro = self.rollout(cfg.envs, [self.seed, iteration])
        figures = episode_figures(ro, cfg)
        rewards = shaped_reward(ro.rewards, ro.score, cfg.alpha_clip) * ro.mask
        adv = advantages(rewards, ro.costs, ro.values_r, ro.values_c, ro.mask, cfg.gamma, cfg.gae_lambda)
        cost = float(episode_cost(ro.costs, ro.progress, cfg.cost_measure, cfg.p_min).mean())
        risk = -figures["safety_score"]
        lam = self.multiplier.value  # the policy is updated under the lambda its rollout was collected with...
        self.multiplier.update(cost, cfg.cost_limit, risk, cfg.risk_threshold, cfg.kappa)  # ...then lambda moves for the next round
        alive = ro.mask.bool()
        flat = {k: v[alive] for k, v in {"x": ro.x, "a": ro.actions, "logp": ro.logp, "ar": adv.reward, "ac": adv.cost, "vr": ro.values_r,
                                         "rr": adv.reward_returns, "vc": ro.values_c, "rc": adv.cost_returns}.items()}
        n, sums, updates = len(flat["a"]), {}, 0
        size = math.ceil(n / cfg.minibatches)
        for _ in range(cfg.epochs):
            order = torch.randperm(n)
            for start in range(0, n, size):
                b = {k: v[order[start: start + size]] for k, v in flat.items()}
                dist = self.agent.distribution(b["x"])
                vpred_r, vpred_c = self.agent.values(b["x"])
                loss, m = ppo_lagrangian_loss(dist.log_prob(b["a"]), b["logp"], dist.entropy(), b["ar"], b["ac"], lam, vpred_r, b["vr"], b["rr"],
                                              vpred_c, b["vc"], b["rc"], cfg.clip_eps, cfg.value_clip, cfg.entropy_coef)
                loss.backward()
                m["grad_norm"] = loop.optimizer_step(iteration, loss, list(self.agent.parameters()), self.optimizer, cfg.max_grad_norm)
                sums = {k: sums.get(k, 0.0) + v for k, v in m.items()}
                updates += 1
        return {**figures, **{k: v / updates for k, v in sums.items()}, "lambda": lam, "lambda_next": self.multiplier.value,
                "cost_for_multiplier": cost, "risk": risk, "violation": violation(cost, cfg.cost_limit, risk, cfg.risk_threshold, cfg.kappa)}

    def evaluate(self, episodes: int) -> tuple[dict[str, float], np.ndarray | None]:
        """Greedy episodes on held-out traffic: their figures and the frames of the first."""
        ro = self.rollout(episodes, [self.seed, HELDOUT_SEED], greedy=True, keep_frames=True)
        return episode_figures(ro, self.cfg), ro.frames


def train_safe_rl(cfg, encoder: ImageTextEncoder, seed: int, loop: TrainLoop | None = None,
                  on_log: Callable[[int, dict], None] | None = None) -> tuple[SafeRL, list[dict], dict[str, float], np.ndarray | None]:
    """(the trained SafeRL, per-round history, final figures `final_*` on held-out greedy episodes, the GIF frames)."""
    loop = loop or TrainLoop()
    trainer = SafeRL(cfg, encoder, seed)
    start, saved = loop.restore(trainer.agent, trainer.parts())
    history = saved.get("history", [])
    for iteration in range(start + 1, cfg.iterations + 1):
        history.append(trainer.round(iteration, loop))
        if on_log and (iteration % cfg.log_every == 0 or iteration == cfg.iterations):
            on_log(iteration, history[-1])
        loop.checkpoint(iteration, cfg.iterations, trainer.agent, trainer.parts(), {"history": history})
    final, frames = trainer.evaluate(cfg.eval_episodes)
    return trainer, history, {f"final_{k}": v for k, v in final.items()} | {"lambda": trainer.multiplier.value, **loop.metrics()}, frames
