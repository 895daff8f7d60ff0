"""PR-OPD, privileged representation on-policy self-distillation (2026, github.com/balibata/PR-OPD;
derived from its abstract, spec section 3):
after a GRPO warm start, the policy writes a hindsight skill k_i for each of its own trajectories, re-reads
the trajectory with k_i prepended (teacher pass, stop-gradient), and every layer's projected student hidden
state (skill-free pass) is pulled to the teacher's on the response tokens, on top of GRPO:

    k_i = pi.write(reflection(x, tau_i, R_i))          (after reading its trajectory and the outcome)
    H^T_{l,t} = sg hidden_l(pi; [k_i; x; y_i])[t],   H^S_{l,t} = hidden_l(pi; [x; y_i])[t]
    L_rep = (1/L) sum_l mask-mean_t || P_l(H^S_{l,t}) - H^T_{l,t} ||^2 / d          (P_l linear, init identity)
    L = L_GRPO + lambda_rep L_rep      (L_rep = 0 during the first `warm_start` updates)

The skill (the `skill_hidden` provider in trainers/extras.py) is written after the reflection prompt
(trainers/contexts.reflection_prompt: the task, the whole trajectory with its observations, the outcome).
A task may declare a structured skill vocabulary (`skill_vocabulary()`, e.g. the text world's `g<cell>`,
"this room's goal is cell c"): the policy then picks its skill by sampling from its own distribution over
the candidates after the reflection (`pick_skills`), since a tiny model writes no useful free text; other
tasks get `skill_tokens` freely sampled tokens. A skill must be a reusable instruction, not the answer
(`admissible_skill`): one the task's verifier accepts as a solution of the episode, or one that contains
the reference completion, is dropped (that row's teacher pass then equals its student pass).

The projectors are a trainable side module (registry meta `module`): the trainer builds them (identity
init), puts them in its optimiser at lr = rl.lr * projector_lr_scale, steps them with the policy after the
same backward pass and checkpoints them with it, so a resumed run equals an uninterrupted one. The student
hidden states come from the trainer's one policy forward (`policy=("hidden",)`). Inference never uses the
projectors. Settings: rl.options.pr_opd.
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor, nn

from posttrain.config import Section
from posttrain.errors import assert_no_grad
from posttrain.objectives import auxiliaries


class PROPDOptions(Section):
    lam_rep: float = Field(0.5, ge=0)
    warm_start: int = Field(50, ge=0)  # GRPO-only updates before the representation term starts
    skill_tokens: int = Field(6, gt=0)  # the length budget of a hindsight skill
    projector_lr_scale: float = Field(10.0, gt=0)


class Projectors(nn.Module):
    """One d -> d linear map per layer, initialised to the identity."""

    def __init__(self, layers: int, width: int):
        super().__init__()
        self.maps = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))
        for linear in self.maps:
            nn.init.eye_(linear.weight)
            nn.init.zeros_(linear.bias)

    def forward(self, hidden: Tensor) -> Tensor:  # [L, B, T, d]
        return torch.stack([p(h) for p, h in zip(self.maps, hidden)])


def representation_loss(student: Tensor, teacher: Tensor, mask: Tensor, projectors: nn.Module | None = None) -> Tensor:
    """Mean over layers of mask-mean_t ||P_l(H^S) - H^T||^2 / d (>= 0; no projector = identity)."""
    assert_no_grad(teacher_hidden=teacher)
    projected = projectors(student) if projectors is not None else student
    sq = ((projected - teacher) ** 2).mean(-1)  # / d
    m = mask.to(sq.dtype)
    return ((sq * m).sum((-1, -2)) / m.sum().clamp(min=1.0)).mean()


def make_projectors(model_config, opts: PROPDOptions) -> Projectors:
    """The side module: one identity-initialised d x d map per decoder layer, trained at rl.lr * projector_lr_scale."""
    projectors = Projectors(model_config.num_hidden_layers, model_config.hidden_size)
    projectors.lr_scale = opts.projector_lr_scale
    return projectors


def admissible_skill(skill: str, reference: str, solves: bool) -> bool:
    """The rule that keeps a hindsight skill an instruction: rejected when the verifier accepts the skill
    itself as a solution of the episode (`solves`) or it contains the episode's reference completion."""
    reference = reference.strip()
    return not solves and not (reference and reference in skill)


def pick_skills(scores: Tensor, temperature: float, generator: torch.Generator | None = None) -> Tensor:
    """[B] the index of each row's skill, sampled from softmax(scores / temperature) over the candidates
    ([B, V] sequence log-probs of each candidate after the row's reflection prompt)."""
    cdf = torch.softmax(scores.float() / temperature, dim=-1).cumsum(-1)
    u = torch.rand(scores.shape[0], 1, generator=generator, device=scores.device) * cdf[:, -1:]  # one draw per row
    return torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp_(max=scores.shape[-1] - 1)


@auxiliaries.register("pr_opd", needs=("skill_hidden", "train_step"), policy=("hidden",), module=make_projectors, options=PROPDOptions)
def pr_opd(batch, policy, cfg, module: Projectors):
    opts: PROPDOptions = cfg.options_for("pr_opd")
    teacher = batch.extras["skill_hidden"]
    if int(batch.extras["train_step"]) <= opts.warm_start or opts.lam_rep == 0 or teacher.numel() == 0:
        return torch.zeros((), device=batch.group.device), {"pr_opd/rep_loss": 0.0}  # the projectors get no gradient: not stepped
    value = representation_loss(policy.hidden, teacher, batch.completion_mask, module)
    return opts.lam_rep * value, {"pr_opd/rep_loss": float(value.detach())}
