"""Judge a flow model's edits: Euler samples from fixed noise, scored by the configured image rewards."""

from __future__ import annotations

import torch
from torch import Tensor

from posttrain.recipes.image.vigor.edits import Edits
from posttrain.recipes.image.flow import ConditionalFlowModel
from posttrain.recipes.image.rewards import image_reward_matrix


@torch.no_grad()
def sample_ode(model: ConditionalFlowModel, conditions: Tensor, text: Tensor, steps: int, generator: torch.Generator) -> Tensor:
    """Deterministic Euler sampling with diffusers' FlowMatchEulerDiscreteScheduler (evaluation)."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    scheduler = FlowMatchEulerDiscreteScheduler()
    scheduler.set_timesteps(steps)
    x = torch.randn(model.latent_shape(conditions.shape[0]), generator=generator)
    for t in scheduler.timesteps:
        x = scheduler.step(model(x, t / 1000.0, conditions, text), t, x).prev_sample
    return x


def judge_edits(model: ConditionalFlowModel, batch: Edits, specs, sampling_steps: int, seed: int) -> tuple[Tensor, tuple[str, ...], Tensor]:
    """([N, K] judge scores, judge names, generated images [N, 3, H, W] in [0, 1]); the same seed gives every
    model the same initial noise. overall = scores.mean(dim=1), in [0, 1]."""
    text = model.encode_text(list(batch.instructions))
    conditions = model.encode_conditions(batch.conditions)
    latents = sample_ode(model, conditions, text, sampling_steps, torch.Generator().manual_seed(seed))
    images = (model.from_latent(latents) + 1) / 2
    scores, names, _ = image_reward_matrix(specs, images, batch.judged())
    return scores, names, images
