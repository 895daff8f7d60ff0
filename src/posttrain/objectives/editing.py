"""Knowledge-editing methods for a stream of edits, registered by name (`edit.method` in params.yaml).

    EditMethod(step: EditStep, opts) -> metrics        leaves the update direction in `.grad` of step.params

The trainer (trainers/editing.py) calls the method `steps_per_edit` times per edit, each time followed by one
optimiser step on the edited parameters; records of earlier edits stay in `step.memory` for methods that replay.

`naive`: sequential fine-tuning on each edit alone, the baseline of lifelong editing (e.g. the "FT" baseline of
Meng et al. 2022, ROME, arXiv 2202.05262, and of the lifelong-editing literature the GLIME abstract addresses):

    L_edit = -log pi_theta(o_new | p_e)             (sequence log-prob of the new object + EOS, as in GLIME)

`glime` (objectives/glime.py) adds generation preference, replay and the gradient constraint.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from posttrain.data.facts import Edit
from posttrain.data.preferences import PreferencePair
from posttrain.registry import Registry

edit_methods: Registry = Registry("edit method")


@dataclass(frozen=True)
class EditRecord:
    """One edit with what its losses read: the edit prompt pair and the generation-preference pairs, whose
    reference log-probs were taken from the model just before the edit was applied (GLIME's reference is the pre-edit model)."""

    edit: Edit
    prompt: str  # p_e
    pref_pairs: tuple[PreferencePair, ...]  # (p', y_w asserting o_new, y_l the model's own pre-edit generation)
    ref_chosen: Tensor  # [K] log pi_ref(y_w | p'), no gradient
    ref_rejected: Tensor  # [K] log pi_ref(y_l | p'), no gradient


@dataclass
class EditStep:
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    params: list[torch.nn.Parameter]  # the edited parameters (the rest is frozen)
    current: list[EditRecord]  # the edit(s) being applied now
    memory: list[EditRecord]  # every earlier edit of the stream, oldest first
    generator: torch.Generator  # for replay sampling


def edit_loss(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, records: Sequence[EditRecord]) -> Tensor:
    """L_edit = -log pi(o_new | p_e), averaged over `records`."""
    from posttrain.trainers.preference import encode_pairs, sequence_logps  # trainers import objectives: import late

    device = next(model.parameters()).device
    # a pair whose rejected side is the old object: one forward pass gives log pi(o_new | p_e) (and the old one)
    pairs = [PreferencePair(r.prompt, r.edit.new, r.edit.old, 0.0, None) for r in records]
    new_logp, _ = sequence_logps(model, encode_pairs(tokenizer, pairs, device))
    return -new_logp.mean()


def grads_of(loss: Tensor, params: Sequence[torch.nn.Parameter]) -> list[Tensor]:
    return [g if g is not None else torch.zeros_like(p) for g, p in zip(torch.autograd.grad(loss, params, allow_unused=True), params)]


def set_grads(params: Sequence[torch.nn.Parameter], grads: Sequence[Tensor]) -> None:
    for p, g in zip(params, grads):
        p.grad = g.detach().clone()


@edit_methods.register("naive")
def naive(step: EditStep, opts: None) -> dict[str, float]:
    """Sequential fine-tuning on the current edit alone: no replay, no constraint, no preference term."""
    loss = edit_loss(step.model, step.tokenizer, step.current)
    set_grads(step.params, grads_of(loss, step.params))
    return {"loss/edit": float(loss.detach())}


from posttrain.objectives import glime  # noqa: E402,F401  (registers)
