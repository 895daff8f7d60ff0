"""Flow-GRPO (arXiv 2505.05470) for the conditional flow model, on the core RL step (trainers/online_rl.py's
`OnlineRL.step`) over the `FlowPolicy` (recipes/image/policy.py), with advantages from the shared estimators (GDPO by
default) over CrossTimeEdit's image judges IA / BP / QP.

One step: take `prompts_per_step` training edits, sample `group_size` images each with the SDE sampler (eq. 9-11),
recording every stochastic denoising step's input, output and log-prob; score the final images with the configured
judges (the core rewards `ia`, `bp`, `qp`) into a [B, K] matrix; turn it into advantages with the registered estimator,
clipped to +-adv_clip_max (rl.adv_clip_max); then re-score the recorded transitions under the current model and apply
the registered policy loss (the clipped ratio) to each transition's log-prob, aggregated over (image, transition) by
`loss_agg`, plus beta times the closed-form Gaussian KL to the frozen SFT model (eq. 12: `FlowPolicy.kl`, the policy's
own KL, in place of the core's k3). One optimizer step per pass; `epochs_per_batch` passes on the same sampled batch
(the core's rl.epochs_per_batch: Flow-GRPO's `num_inner_epochs`), at a constant learning rate. On the first pass the
ratio is exactly 1 (the core's `mismatch/*` figures compare that pass with the sampling log-probs), so the clip only
binds from the second pass on, once the policy has moved off the sampling policy; the loss figures (`ratio_mean`,
`clip_fraction`, `kl`, `loss`) are the last pass's.

Being the core step, it brings the core's options with it: `micro_batch` (chains per forward/backward pass, the whole
batch's gradient) and `dynamic_sampling` (DAPO: an edit whose images all score alike carries no advantage; it is dropped
and fresh edits, drawn from the same generator, are sampled in its place, at most `dynamic_sampling_max_rollouts` times).

Everything runs in the model's latent space (pixels for the UNet, packed VAE latents for FLUX); the final
sample is decoded to pixels for the judges. Every `checkpoint_every` steps the trainer saves the weights,
the optimizer, the sampler's generator (which also draws each step's edits), every RNG and the history
(trainers/checkpoint.py); a resumed run continues from the last checkpoint to the same result as an uninterrupted one.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from posttrain.config import RLConfig
from posttrain.recipes.image.policy import FlowPolicy, FlowTask, stochastic_steps
from posttrain.recipes.image.settings import FlowRLConfig
from posttrain.recipes.image.vigor.edits import Edits
from posttrain.runtime import progress
from posttrain.trainers.loop import TrainLoop
from posttrain.trainers.online_rl import OnlineRL, RLRun, rl_of_section


def rl_settings(cfg: FlowRLConfig) -> RLConfig:
    """The core step's settings for the `flow_rl` section: its keys shared with `rl` (advantage, loss, loss_agg, clip
    bounds, std settings, adv_clip_max, beta, lr, epochs_per_batch, ...), the judges as the rewards, a completion of
    J = `stochastic_steps` transitions, and a constant learning rate without warm-up (as Flow-GRPO's loop had)."""
    judges = tuple({"name": r.name, "weight": r.weight} for r in cfg.rewards)
    return rl_of_section(cfg, rewards=judges, max_new_tokens=stochastic_steps(cfg), warmup_steps=0, lr_schedule="constant")


def flow_trainer(model, edits: Edits, cfg: FlowRLConfig, seed: int, loop: TrainLoop | None = None, max_unscored_steps: int = 3) -> OnlineRL:
    """The core RL trainer over `model` as a `FlowPolicy` (the reference, when beta > 0, is a frozen copy of it as it
    starts, made before any checkpoint loads), the edits as its task; more than `max_unscored_steps` steps in a row
    whose images no judge could score (training.max_unscored_steps: a diverged model's NaN images) stop the run."""
    loop = loop or TrainLoop()
    task = FlowTask(edits)
    run = RLRun(policy=model, tokenizer=None, task=task, examples=task.examples(), cfg=rl_settings(cfg), seed=seed,
                checkpoint_dir=loop.checkpoint_dir, config_hash=loop.config_hash, checkpoint_section="flow_rl",
                max_unscored_steps=max_unscored_steps, adapter=FlowPolicy(model, cfg))
    return OnlineRL(run, loop=loop)


def train_flow_rl(model, edits: Edits, cfg: FlowRLConfig, seed: int, on_log: Callable[[int, dict[str, float]], None],
                  loop: TrainLoop | None = None, max_unscored_steps: int = 3) -> list[dict[str, float]]:
    """`cfg.steps` Flow-GRPO updates; `loop` (trainers/loop.py) guards each step and, in a stage, checkpoints every
    `flow_rl.checkpoint_every` steps and resumes. Returns the per-step history (restored on resume)."""
    loop = loop or TrainLoop()
    trainer = flow_trainer(model, edits, cfg, seed, loop, max_unscored_steps)
    examples = trainer.run.examples
    parts = {"trainer": trainer}
    start_step, saved = loop.restore(model, parts)
    history: list[dict[str, float]] = saved.get("history", [])
    model.eval()  # sampling and re-scoring must use the same network function (no dropout)
    bar = progress(cfg.steps, "flow_rl", initial=start_step)

    def draw(n: int) -> list:  # n distinct edits from the sampler's generator (checkpointed with it); the refills of dynamic sampling too
        drawn = torch.randperm(len(examples), generator=trainer.generator, device=trainer.generator.device)[:n]
        return [examples[i] for i in drawn.tolist()]

    for step_index in range(start_step + 1, cfg.steps + 1):
        start = time.perf_counter()
        result = trainer.step(draw(cfg.prompts_per_step), more_prompts=draw)
        metrics = {**result.metrics, "reward/overall_mean": float(result.batch.rewards.mean()), "step_seconds": time.perf_counter() - start}
        history.append({"step": step_index, **metrics})
        if step_index % cfg.log_every == 0:
            on_log(step_index, metrics)
        bar.update(1)
        loop.checkpoint(step_index, cfg.steps, model, parts, {"history": history})
    bar.close()
    model.eval()
    return history
