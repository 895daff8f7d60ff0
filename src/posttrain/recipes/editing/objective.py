"""Knowledge-editing methods for a stream of edits, registered by name (`edit.method` in params.yaml).

    EditMethod(step: EditStep, opts) -> metrics        leaves the update direction in `.grad` of step.params

The metrics' `loss/*` entries are the method's loss terms: the trainer's guard skips a step where one is not finite.

The trainer (recipes/editing/trainer.py) calls the method `steps_per_edit` times per edit, each time followed by one
optimiser step on the edited parameters; records of earlier edits stay in `step.memory` for methods that replay.
A method runs no forward pass itself: `step.pair_logps(pairs)` is the trainer's scorer (sequence log-probs of
each pair's chosen and rejected answer after its prompt, with gradient).

`naive`: sequential fine-tuning on each edit alone, the baseline of lifelong editing (e.g. the "FT" baseline of
Meng et al. 2022, ROME, arXiv 2202.05262, and of the lifelong-editing literature the GLIME abstract addresses):

    L_edit = -log pi_theta(o_new | p_e)             (sequence log-prob of the new object + EOS, as in GLIME)

`naive_paraphrase`: the same fine-tuning, also on the paraphrase prompts GLIME's preference term reads, with the new
object as their target; GLIME's prompt exposure without its preference, replay or constraint (the control that tells
the preference effect from seeing more prompts):

    L = L_edit - mean_{p'} log pi_theta(o_new | p')

`glime` (recipes/editing/glime.py) adds generation preference, replay and the gradient constraint.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from posttrain.registry import Registry

if TYPE_CHECKING:
    from posttrain.recipes.editing.facts import Edit
    from posttrain.data.preferences import PreferencePair

edit_methods: Registry = Registry("edit method")


@dataclass(frozen=True)
class EditRecord:
    """One edit with what its losses read: the edit prompt pair and the generation-preference pairs, whose
    reference log-probs were taken from the model just before the edit was applied (GLIME's reference is the pre-edit model)."""

    edit: Edit
    prompt: str  # p_e
    edit_pair: PreferencePair  # (p_e, o_new, o_old): its chosen side is the edit's target
    pref_pairs: tuple[PreferencePair, ...]  # (p', y_w asserting o_new, y_l the model's own pre-edit generation)
    ref_chosen: Tensor  # [K] log pi_ref(y_w | p'), no gradient
    ref_rejected: Tensor  # [K] log pi_ref(y_l | p'), no gradient


PairScorer = Callable[[Sequence["PreferencePair"]], tuple[Tensor, Tensor]]  # pairs -> (chosen, rejected) log-probs [N]


@dataclass
class EditStep:
    pair_logps: PairScorer  # the trainer's forward pass over pairs, with gradient
    params: list[torch.nn.Parameter]  # the edited parameters (the rest is frozen)
    current: list[EditRecord]  # the edit(s) being applied now
    memory: list[EditRecord]  # every earlier edit of the stream, oldest first
    generator: torch.Generator  # for replay sampling


def edit_loss(pair_logps: PairScorer, records: Sequence[EditRecord]) -> Tensor:
    """L_edit = -log pi(o_new | p_e), averaged over `records` (one pass over the edit pairs gives it)."""
    new_logp, _ = pair_logps([r.edit_pair for r in records])
    return -new_logp.mean()


def grads_of(loss: Tensor, params: Sequence[torch.nn.Parameter]) -> list[Tensor]:
    return [g if g is not None else torch.zeros_like(p) for g, p in zip(torch.autograd.grad(loss, params, allow_unused=True), params)]


def set_grads(params: Sequence[torch.nn.Parameter], grads: Sequence[Tensor]) -> None:
    for p, g in zip(params, grads):
        p.grad = g.detach().clone()


@edit_methods.register("naive")
def naive(step: EditStep, opts: None) -> dict[str, float]:
    """Sequential fine-tuning on the current edit alone: no replay, no constraint, no preference term."""
    loss = edit_loss(step.pair_logps, step.current)
    set_grads(step.params, grads_of(loss, step.params))
    return {"loss/edit": float(loss.detach())}


def paraphrase_loss(pair_logps: PairScorer, records: Sequence[EditRecord]) -> Tensor:
    """-log pi(o_new | p') averaged over the paraphrase prompts of `records` (the chosen side of their preference pairs)."""
    new_logp, _ = pair_logps([p for r in records for p in r.pref_pairs])
    return -new_logp.mean()


@edit_methods.register("naive_paraphrase")
def naive_paraphrase(step: EditStep, opts: None) -> dict[str, float]:
    """Sequential fine-tuning on the current edit's prompt and its paraphrase prompts: no replay, no constraint, no
    preference term."""
    edit = edit_loss(step.pair_logps, step.current)
    metrics = {"loss/edit": float(edit.detach())}
    loss = edit
    if any(r.pref_pairs for r in step.current):
        paraphrase = paraphrase_loss(step.pair_logps, step.current)
        loss = loss + paraphrase
        metrics["loss/paraphrase"] = float(paraphrase.detach())
    set_grads(step.params, grads_of(loss, step.params))
    return metrics


from posttrain.recipes.editing import glime  # noqa: E402,F401  (registers)
