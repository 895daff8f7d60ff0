"""Flow-GRPO (arXiv 2505.05470) for the conditional flow model, with advantages from the shared estimators (GDPO
by default) over CrossTimeEdit's image judges IA / BP / QP.

One step: take `prompts_per_step` training edits, sample `group_size` images each with the SDE sampler
(objectives/flow_grpo.py), recording every denoising step's input, output and log-prob; score the final
images with the configured rewards into a [B, K] matrix; turn it into advantages with the estimator's
`on_rewards` core, clipped to +-adv_clip_max; then, per denoising step, re-score the recorded transition
under the current model and apply the registered policy loss (the clipped ratio) plus beta times the
closed-form Gaussian KL to the frozen SFT model. Gradients accumulate over the steps, then one optimizer step;
this repeats `epochs_per_batch` times on the same sampled batch (Flow-GRPO's `num_inner_epochs`). On the first
pass the ratio is exactly 1, so the clip only binds from the second pass on, once the policy has moved off the
sampling policy; the metrics are the last pass's, with the first pass's loss and every pass's ratio and clip
fraction as `pass<k>/...`.

Everything runs in the model's latent space (pixels for the UNet, packed VAE latents for FLUX); the final
sample is decoded to pixels for the judges. Every `checkpoint_every` steps the trainer saves the weights,
the optimizer, the sampler's generator, every RNG and the history (trainers/checkpoint.py); a resumed run
continues from the last checkpoint to the same result as an uninterrupted one.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from posttrain.recipes.image.settings import FlowRLConfig
from posttrain.recipes.image.vigor.edits import Edits
from posttrain.recipes.image.flow import ConditionalFlowModel
from posttrain.objectives import advantages as estimators
from posttrain.objectives import losses
from posttrain.objectives.loss_settings import LossSettings
from posttrain.objectives.flow_grpo import clip_advantages, gaussian_kl, sde_step
from posttrain.recipes.image.rewards import image_reward_matrix
from posttrain.runtime import progress
from posttrain.trainers.loop import TrainLoop


def sigma_schedule(steps: int) -> list[float]:
    """The flow-matching sigmas from 1 (noise) to 0, as diffusers' FlowMatchEulerDiscreteScheduler sets them."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    scheduler = FlowMatchEulerDiscreteScheduler()
    scheduler.set_timesteps(steps)
    return [float(s) for s in scheduler.sigmas]


@dataclass(frozen=True)
class Trajectory:
    states: Tensor  # [J + 1, B, *latent] x at every sigma, states[0] the initial noise
    logp: Tensor  # [J, B] log-prob of each recorded transition at sampling time
    final: Tensor  # [B, *latent] the final sample (pixels in [-1, 1] for the UNet; decode with model.from_latent)


def stochastic_steps(cfg: FlowRLConfig) -> int:
    """How many leading denoising steps are sampled with noise and trained on (Flow-GRPO's timestep_fraction)."""
    return max(1, int(cfg.timestep_fraction * cfg.sampling_steps))


@torch.no_grad()
def sample_sde(model: ConditionalFlowModel, conditions: Tensor, text: Tensor, sigmas: list[float], noise_level: float,
               generator: torch.Generator, stochastic: int | None = None) -> Trajectory:
    """SDE steps for the first `stochastic` steps (all by default), then Euler steps: in pixel space the noise
    injected by a late SDE step would stay in the image, while the ODE tail denoises it (the SDE keeps the
    marginals, so the state entering the tail is a proper sample at its noise level)."""
    x = torch.randn(model.latent_shape(conditions.shape[0]), generator=generator)
    states, logps = [x], []
    stochastic = len(sigmas) - 1 if stochastic is None else stochastic
    for j, (sigma, sigma_prev) in enumerate(zip(sigmas[:-1], sigmas[1:])):
        level = noise_level if j < stochastic else 0.0
        step = sde_step(x, model(x, torch.tensor(sigma), conditions, text), sigma, sigma_prev, level, sigmas[1], generator=generator)
        x = step.prev
        states.append(x)
        logps.append(step.logp)
    return Trajectory(torch.stack(states), torch.stack(logps), x)


def image_advantages(rewards: Tensor, group: Tensor, weights: Tensor, cfg: FlowRLConfig) -> Tensor:
    """The registered estimator's reward-matrix core (e.g. GDPO), then Flow-GRPO's clip to +-adv_clip_max."""
    core = estimators.entry(cfg.advantage).meta["on_rewards"]
    return clip_advantages(core(rewards, group, weights, cfg), cfg.adv_clip_max)


def policy_update(model: ConditionalFlowModel, reference: ConditionalFlowModel | None, trajectory: Trajectory, conditions: Tensor,
                  text: Tensor, adv: Tensor, sigmas: list[float], cfg: FlowRLConfig) -> dict[str, float]:
    """Accumulate the per-step clipped surrogate (+ beta KL) gradients over the stochastic head of the chain
    (Flow-GRPO's `timestep_fraction`; the deterministic tail has no density and is not trained)."""
    loss_fn, settings = losses.get(cfg.loss), LossSettings.of(cfg)
    steps = stochastic_steps(cfg)  # the stochastic transitions are the trained ones
    mask = torch.ones(adv.shape[0], 1)
    totals = {"loss": 0.0, "kl": 0.0, "clip_fraction": 0.0, "ratio_mean": 0.0}
    for j, (sigma, sigma_prev) in enumerate(zip(sigmas[:steps], sigmas[1 : steps + 1])):
        x, prev = trajectory.states[j], trajectory.states[j + 1]
        step = sde_step(x, model(x, torch.tensor(sigma), conditions, text), sigma, sigma_prev, cfg.noise_level, sigmas[1], prev=prev)
        loss, metrics = loss_fn(step.logp[:, None], trajectory.logp[j][:, None], adv, mask, settings)
        if reference is not None and cfg.beta > 0 and float(step.scale) > 0:
            with torch.no_grad():
                ref = sde_step(x, reference(x, torch.tensor(sigma), conditions, text), sigma, sigma_prev, cfg.noise_level, sigmas[1], prev=prev)
            kl = gaussian_kl(step.mean, ref.mean, step.scale).mean()
            loss = loss + cfg.beta * kl
            totals["kl"] += float(kl.detach()) / steps
        (loss / steps).backward()
        totals["loss"] += float(loss.detach()) / steps
        totals["clip_fraction"] += metrics["clip_fraction"] / steps
        totals["ratio_mean"] += metrics["ratio_mean"] / steps
    return totals


def train_flow_rl(model: ConditionalFlowModel, edits: Edits, cfg: FlowRLConfig, seed: int,
                  on_log: Callable[[int, dict[str, float]], None], loop: TrainLoop | None = None) -> list[dict[str, float]]:
    """`cfg.steps` Flow-GRPO updates; `loop` (trainers/loop.py) guards each step and, in a stage, checkpoints every
    `flow_rl.checkpoint_every` steps and resumes. Returns the per-step history (restored on resume)."""
    loop = loop or TrainLoop()
    generator = torch.Generator().manual_seed(seed)
    sigmas = sigma_schedule(cfg.sampling_steps)
    reference = None
    if cfg.beta > 0:  # the starting policy, also when resuming (copied before any checkpoint is loaded)
        reference = copy.deepcopy(model).eval().requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    parts = {"optimizer": optimizer, "generator": generator}
    start_step, saved = loop.restore(model, parts)
    history: list[dict[str, float]] = saved.get("history", [])
    bar = progress(cfg.steps, "flow_rl", initial=start_step)
    for step_index in range(start_step + 1, cfg.steps + 1):
        start = time.perf_counter()
        prompts = torch.randperm(len(edits), generator=generator)[: cfg.prompts_per_step]
        index = prompts.repeat_interleave(cfg.group_size)
        batch = edits.take(index)
        text = model.encode_text(list(batch.instructions))
        conditions = model.encode_conditions(batch.conditions)
        group = torch.arange(prompts.numel()).repeat_interleave(cfg.group_size)
        model.eval()  # sampling and re-scoring must use the same network function (no dropout)
        trajectory = sample_sde(model, conditions, text, sigmas, cfg.noise_level, generator, stochastic_steps(cfg))
        images = model.from_latent(trajectory.final)
        rewards, names, weights = image_reward_matrix(cfg.rewards, (images + 1) / 2, batch.judged())
        adv = image_advantages(rewards, group, weights, cfg)
        passes = []
        for _ in range(cfg.epochs_per_batch):  # the same trajectory and advantages; the policy moves each pass
            passes.append(policy_update(model, reference, trajectory, conditions, text, adv, sigmas, cfg))
            grad_norm = loop.optimizer_step(step_index, passes[-1]["loss"], params, optimizer, cfg.max_grad_norm)
        metrics = dict(passes[-1])
        if len(passes) > 1:
            metrics["first_pass_loss"] = passes[0]["loss"]
            for k, m in enumerate(passes, 1):
                metrics.update({f"pass{k}/ratio_mean": m["ratio_mean"], f"pass{k}/clip_fraction": m["clip_fraction"]})
        for k, name in enumerate(names):
            metrics[f"reward/{name}_mean"] = float(rewards[:, k].mean())
        metrics["reward/overall_mean"] = float(rewards.mean())
        metrics["grad_norm"] = grad_norm
        metrics["nonfinite_steps"] = float(loop.nonfinite_steps)
        metrics["step_seconds"] = time.perf_counter() - start
        history.append({"step": step_index, **metrics})
        if step_index % cfg.log_every == 0:
            on_log(step_index, metrics)
        bar.update(1)
        loop.checkpoint(step_index, cfg.steps, model, parts, {"history": history})
    bar.close()
    model.eval()
    return history
