"""Supervised flow matching on curated quadruplets (rectified flow; Liu et al. 2022, arXiv 2209.03003;
Lipman et al. 2022, arXiv 2210.02747, the conditional flow-matching loss, eq. 23 with the linear path):

    x_sigma = (1 - sigma) x_0 + sigma noise,   sigma ~ U(0, 1)
    loss    = || v_theta(x_sigma, sigma | S_new, A_old, A_new, text) - (noise - x_0) ||^2

x_0 is the past street view S_old (in the model's latent space: pixels for the UNet, packed VAE latents for
FLUX); the conditions are the recent view and the satellite pair.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from posttrain.recipes.image.settings import FlowSFTConfig
from posttrain.recipes.image.vigor.edits import Edits
from posttrain.recipes.image.flow import ConditionalFlowModel
from posttrain.runtime import progress
from posttrain.trainers.common import optimizer_and_schedule
from posttrain.trainers.loop import TrainLoop


def flow_matching_loss(model: ConditionalFlowModel, batch: Edits, generator: torch.Generator) -> Tensor:
    x0 = model.to_latent(batch.target)
    noise = torch.randn(x0.shape, generator=generator)
    sigma = torch.rand(x0.shape[0], generator=generator)
    s = sigma.view(-1, *([1] * (x0.dim() - 1)))
    x_sigma = (1 - s) * x0 + s * noise
    velocity = model(x_sigma, sigma, model.encode_conditions(batch.conditions), model.encode_text(list(batch.instructions)))
    return ((velocity - (noise - x0)) ** 2).mean()


def train_flow_sft(model: ConditionalFlowModel, edits: Edits, cfg: FlowSFTConfig, seed: int,
                   on_log: Callable[[int, dict[str, float]], None], loop: TrainLoop | None = None) -> list[dict[str, float]]:
    """`cfg.steps` flow-matching updates; `loop` (trainers/loop.py) guards each step and, in a stage, checkpoints
    and resumes. Returns the logged history (restored on resume); its last row carries `nonfinite_steps`."""
    loop = loop or TrainLoop()
    generator = torch.Generator().manual_seed(seed)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer, schedule = optimizer_and_schedule(params, cfg.lr, 0.0, cfg.warmup_steps, cfg.steps)
    parts = {"optimizer": optimizer, "schedule": schedule, "generator": generator}
    start, saved = loop.restore(model, parts)
    history, window = saved.get("history", []), saved.get("window", [])
    model.train()
    bar = progress(cfg.steps, "flow_sft", initial=start)
    for step in range(start + 1, cfg.steps + 1):
        index = torch.randint(len(edits), (min(cfg.batch_size, len(edits)),), generator=generator)
        loss = flow_matching_loss(model, edits.take(index), generator)
        loss.backward()
        loop.optimizer_step(step, loss, params, optimizer, cfg.max_grad_norm)
        schedule.step()
        window.append(float(loss.detach()))
        bar.update(1)
        if step % cfg.log_every == 0 or step == cfg.steps:
            metrics = {"loss": sum(window) / len(window), "lr": schedule.get_last_lr()[0], **loop.metrics()}
            window = []
            history.append({"step": step, **metrics})
            on_log(step, metrics)
        loop.checkpoint(step, cfg.steps, model, parts, {"history": history, "window": window})
    bar.close()
    model.eval()
    return history
