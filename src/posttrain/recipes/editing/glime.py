"""GLIME, Generalizable Lifelong Model Editing (2026; derived from its abstract): knowledge editing plus
preference optimisation over the model's own generations, replay of earlier edits, and a gradient constraint.

For the current edit(s) B and a replayed sample B_r of earlier edits (|B_r| = `replay_size`, the memory buffer M
is unbounded):

    L_edit(B) = -log pi_theta(o_new | p_e)                                   averaged over B
    L_pref(B) = -log sigmoid(beta * h_theta(p', y_w, y_l))                   DPO (Rafailov et al. 2023, arXiv
                2305.18290, eq. 7) on paraphrase prompts p' of each edit: y_w asserts o_new, y_l is the model's own
                greedy generation before the edit (o_old when that already says o_new); ref = the pre-edit model
    g     = grad [L_edit(B)   + lambda_p L_pref(B)]
    g_ref = grad [L_edit(B_r) + lambda_p L_pref(B_r)]
    if <g, g_ref> < 0:   g <- g - (<g, g_ref> / ||g_ref||^2) g_ref          A-GEM (Chaudhry et al. 2019, "Efficient
                                                                             Lifelong Learning with A-GEM", arXiv
                                                                             1812.00420, eq. 11)
    update direction = g + g_ref                                             (replayed edits are in the loss too)

g and g_ref are flattened over the edited parameters. Invariants: after projection <g, g_ref> >= 0; an empty
replay buffer (g_ref None) leaves g unchanged; at the first step of an edit L_pref = log 2 per pair (policy = ref);
with lambda_p = 0 and replay_size = 0 the step is the naive fine-tuning step. The optional locality KL to the pre-edit
model on unrelated prompts is not implemented.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from pydantic import Field
from torch import Tensor

from posttrain.config import Section
from posttrain.recipes.editing.objective import EditRecord, EditStep, edit_loss, edit_methods, grads_of, set_grads
from posttrain.objectives.preference import PairLogps, log_ratio_margin, sigmoid_loss


def project_gradient(g: Tensor, g_ref: Tensor | None) -> Tensor:
    """g with its component against g_ref removed when the two conflict (flat tensors)."""
    if g_ref is None:
        return g
    dot = torch.dot(g, g_ref)
    norm = torch.dot(g_ref, g_ref)
    if dot >= 0 or norm == 0:
        return g
    return g - (dot / norm) * g_ref


def project_parameter_grads(params: Sequence[torch.nn.Parameter], ref_grads: Sequence[Tensor] | None) -> bool:
    """Apply `project_gradient` to the .grad of `params` in place, with `ref_grads` (one per parameter) as g_ref;
    returns True when the gradients conflicted and were projected."""
    if ref_grads is None:
        return False
    flat = torch.cat([p.grad.flatten() for p in params])
    ref = torch.cat([r.flatten() for r in ref_grads])
    projected = project_gradient(flat, ref)
    if projected is flat:
        return False
    offset = 0
    for p in params:
        p.grad.copy_(projected[offset : offset + p.numel()].view_as(p))
        offset += p.numel()
    return True


class GlimeOptions(Section):  # edit.options.glime
    beta: float = Field(0.1, gt=0)  # DPO inverse temperature of L_pref
    lambda_p: float = Field(1.0, ge=0)  # weight of L_pref; 0 drops the generation-preference term
    replay_size: int = Field(1, ge=0)  # |B_r|, earlier edits replayed per step; 0 disables replay and the constraint
    project: bool = True  # false: replay without the A-GEM projection (ablation)


def preference_loss(step: EditStep, records: Sequence[EditRecord], beta: float) -> Tensor:
    """L_pref: sigmoid DPO over every generation-preference pair of `records`, mean over pairs."""
    chosen, rejected = step.pair_logps([p for r in records for p in r.pref_pairs])
    ref_chosen, ref_rejected = torch.cat([r.ref_chosen for r in records]), torch.cat([r.ref_rejected for r in records])
    zeros = torch.zeros_like(ref_chosen)
    logps = PairLogps(chosen, rejected, ref_chosen, ref_rejected, zeros, torch.full_like(zeros, float("nan")))
    return sigmoid_loss(log_ratio_margin(logps), beta).mean()


def glime_loss(step: EditStep, records: Sequence[EditRecord], opts: GlimeOptions) -> tuple[Tensor, dict[str, float]]:
    loss = edit_loss(step.pair_logps, records)
    metrics = {"edit": float(loss.detach())}
    if opts.lambda_p > 0 and any(r.pref_pairs for r in records):
        pref = preference_loss(step, records, opts.beta)
        loss = loss + opts.lambda_p * pref
        metrics["pref"] = float(pref.detach())
    return loss, metrics


def replay_sample(memory: Sequence[EditRecord], size: int, generator: torch.Generator) -> list[EditRecord]:
    picks = torch.randperm(len(memory), generator=generator)[: min(size, len(memory))]
    return [memory[int(i)] for i in picks]


@edit_methods.register("glime", options=GlimeOptions)
def glime(step: EditStep, opts: GlimeOptions) -> dict[str, float]:
    """One GLIME step: the current edits' gradient, projected against the replayed edits' gradient, plus it."""
    loss, parts = glime_loss(step, step.current, opts)
    set_grads(step.params, grads_of(loss, step.params))
    metrics = {f"loss/{k}": v for k, v in parts.items()}
    replay = replay_sample(step.memory, opts.replay_size, step.generator)
    if not replay:
        return metrics
    replay_loss, replay_parts = glime_loss(step, replay, opts)
    ref_grads = grads_of(replay_loss, step.params)
    g = torch.cat([p.grad.flatten() for p in step.params])
    g_ref = torch.cat([r.flatten() for r in ref_grads])
    metrics["glime/cosine"] = float(torch.nn.functional.cosine_similarity(g, g_ref, dim=0))
    metrics["glime/projected"] = float(project_parameter_grads(step.params, ref_grads if opts.project else None))
    for p, r in zip(step.params, ref_grads):
        p.grad.add_(r)
    metrics.update({f"loss/replay_{k}": v for k, v in replay_parts.items()})
    return metrics
