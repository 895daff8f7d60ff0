"""Image-editing rewards (CrossTimeEdit's three judges: Instruction Alignment, Background Preservation,
Quality and Physical Plausibility), registered by name in `image_rewards`.

    ImageRewardFn(generated [N, 3, H, W], edit: EditBatch) -> Tensor [N] in [0, 1]

A separate registry from the text rewards because the inputs differ: a text reward scores decoded strings
against a task's verifier, an image reward scores generated images against the edit's conditions. The
output is the same kind of thing, one reward column, and the columns form the same [B, K] reward matrix that
the shared advantage estimators (GDPO) consume. These are programmatic judges for the synthetic data, where
the target past view and the edited region are known; a VLM judge registers under the same names' contract.
Images are in [0, 1]; `generated` is the model output mapped to [0, 1] *before* clipping, so that
out-of-range values count against quality.

Each judge is also registered under its name in the core `rewards` registry, for flow_rl's run on the core RL step
(trainers/online_rl.py): there the completions are the flow policy's images (recipes/image/policy.py's
`FlowPolicy.decode`) and the run's task (`FlowTask`) gives each sample's edit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from posttrain.registry import Registry
from posttrain.rewards import rewards

image_rewards: Registry = Registry("image reward")


@dataclass(frozen=True)
class EditBatch:
    source: Tensor  # [N, 3, H, W] the recent street view S_new
    target: Tensor  # [N, 3, H, W] the past street view S_old
    edit_mask: Tensor  # [N, 1, H, W] 1 inside the region the instruction edits (all 0 for no_change)
    instructions: tuple[str, ...]


def _masked_mae(a: Tensor, b: Tensor, mask: Tensor) -> Tensor:
    """[N] mean absolute difference over the pixels where mask is 1 (and channels)."""
    weight = mask.expand_as(a)
    return ((a - b).abs() * weight).sum(dim=(1, 2, 3)) / weight.sum(dim=(1, 2, 3)).clamp(min=1.0)


@image_rewards.register("ia")
def instruction_alignment(generated: Tensor, edit: EditBatch) -> Tensor:
    """IA: how much of the instructed change is made inside the edit region: 1 - e(gen, target) / (e(source,
    target) + 0.05), clipped to [0, 1], with e the mean absolute error over the region (the whole image when
    the instruction is to keep the scene). Copying the recent view scores ~0; the true past view 1."""
    empty = edit.edit_mask.sum(dim=(1, 2, 3)) == 0
    region = torch.where(empty[:, None, None, None], torch.ones_like(edit.edit_mask), edit.edit_mask)
    gen = generated.clamp(0, 1)
    progress = 1 - _masked_mae(gen, edit.target, region) / (_masked_mae(edit.source, edit.target, region) + 0.05)
    return progress.clamp(0, 1)


@image_rewards.register("bp")
def background_preservation(generated: Tensor, edit: EditBatch) -> Tensor:
    """BP: outside the edit region the output should equal the recent view: 1 - MAE / 0.15, clipped to [0, 1]."""
    keep = 1 - edit.edit_mask
    return (1 - _masked_mae(generated.clamp(0, 1), edit.source, keep) / 0.15).clamp(0, 1)


def total_variation(images: Tensor) -> Tensor:
    """[N] mean absolute difference between neighbouring pixels (both directions)."""
    dx = (images[..., :, 1:] - images[..., :, :-1]).abs().mean(dim=(1, 2, 3))
    dy = (images[..., 1:, :] - images[..., :-1, :]).abs().mean(dim=(1, 2, 3))
    return dx + dy


@image_rewards.register("qp")
def quality_plausibility(generated: Tensor, edit: EditBatch) -> Tensor:
    """QP: physically plausible pixels (inside [0, 1]) and natural texture (total variation close to the
    recent view's, so neither noise nor smearing): in_range * exp(-|TV(gen) - TV(source)| / TV(source))."""
    in_range = 1 - ((generated < -0.02) | (generated > 1.02)).float().mean(dim=(1, 2, 3))
    tv_gen, tv_src = total_variation(generated.clamp(0, 1)), total_variation(edit.source)
    return in_range * torch.exp(-(tv_gen - tv_src).abs() / tv_src.clamp(min=1e-3))


def image_reward_matrix(specs, generated: Tensor, edit: EditBatch) -> tuple[Tensor, tuple[str, ...], Tensor]:
    """([N, K] scores, names, weights [K]) for the configured rewards (flow_rl.rewards)."""
    columns = [image_rewards.get(s.name)(generated, edit).float() for s in specs]
    return torch.stack(columns, dim=1), tuple(s.name for s in specs), torch.tensor([s.weight for s in specs])


# -- the judges as core rewards (flow_rl on trainers/online_rl.py): completions are images, the task holds the edits --

def _judge_column(name: str, task, examples, completions) -> Tensor:
    return image_rewards.get(name)(torch.stack(list(completions)), task.judged(examples)).float()


@rewards.register("ia", tasks=("image",))
def ia_reward(task, examples, completions, finished) -> Tensor:
    """CrossTimeEdit's Instruction Alignment judge on the flow policy's images (stage flow_rl; image_rewards `ia`)."""
    return _judge_column("ia", task, examples, completions)


@rewards.register("bp", tasks=("image",))
def bp_reward(task, examples, completions, finished) -> Tensor:
    """CrossTimeEdit's Background Preservation judge on the flow policy's images (stage flow_rl; image_rewards `bp`)."""
    return _judge_column("bp", task, examples, completions)


@rewards.register("qp", tasks=("image",))
def qp_reward(task, examples, completions, finished) -> Tensor:
    """CrossTimeEdit's Quality and Physical Plausibility judge on the flow policy's images (stage flow_rl; image_rewards `qp`)."""
    return _judge_column("qp", task, examples, completions)
