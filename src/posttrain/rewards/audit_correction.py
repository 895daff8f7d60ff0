"""Selective control under partial auditing (2026; our formulation, derived from its abstract): an imperfect
verifier V that also accepts some wrong answers, and the inverse-propensity audit correction

    E(y) = V(y) (1 - C(y))                          accepted error
    r(y) = V(y) - mu (O(y) / rho) E(y)              "minimal": only acts on accepted errors
    r(y) = V(y) + mu (O(y) / rho) (C(y) - V(y))     "symmetric": also lifts audited correct-but-rejected answers
    O(y) ~ Bernoulli(rho), independent per sample   (C is observed only where O = 1)

E_O[r] = V - mu E, so with mu > 1 accepted errors have negative expected reward and lose probability.
V here: C, or, for a wrong answer the task can parse, a fixed seeded coin of probability `false_accept`
keyed on (seed, prompt, completion), so the same wrong answer is accepted every time (exploitable).
`flaw: shared` keys the coin on (seed, completion) alone: the verifier accepts the same wrong answer strings on
every prompt, a flaw a policy can learn once and use everywhere, held-out prompts included (as a checker that
waves through certain outputs whatever the question); `per_prompt` (the default) can only be memorised prompt
by prompt.
Audits are drawn from torch's global generator, which the trainer seeds from pipeline.seed and saves in
every checkpoint, so a resumed run draws the same audits as an uninterrupted one.
Invariants: E_audit[r] = V - mu E; unaudited -> exactly V; rho = 1 -> V - mu E; mu > 1 raises the correct
arm and lowers the accepted-error arm of a 3-arm bandit, mu = 0 raises the accepted-error arm.
Settings: rl.options.audit_correction (defaults on its options model below); needs the rl settings (`needs=("rl",)`).
"""

from __future__ import annotations

import hashlib
from typing import Literal

import torch
from pydantic import Field
from torch import Tensor

from posttrain.config import Section
from posttrain.rewards import rewards


class AuditOptions(Section):
    false_accept: float = Field(0.1, ge=0, le=1)  # probability that the verifier accepts a given wrong, parsable answer
    audit_rate: float = Field(0.1, gt=0, le=1)  # rho: each sample is audited independently with this probability
    mu: float = Field(2.0, ge=0)  # correction strength; must exceed 1 for selective control (0: pure RLVR on V)
    variant: Literal["minimal", "symmetric"] = "minimal"  # minimal | symmetric (r = V + mu (O / rho) (C - V))
    seed: int = 0  # seeds the verifier's false accepts (the audits follow pipeline.seed)
    flaw: Literal["per_prompt", "shared"] = "per_prompt"  # per_prompt: a wrong answer's coin is drawn per prompt; shared: once for every prompt


def unit_hash(*parts: str) -> float:
    """A deterministic number in [0, 1) from the parts."""
    digest = hashlib.blake2b("\0".join(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def imperfect_verifier(correct: bool, parsable: bool, prompt: str, completion: str, opts: AuditOptions) -> float:
    """V(y): accepts every correct answer and a seeded `false_accept` share of the parsable wrong ones (drawn per
    prompt, or once per answer string with `flaw: shared`)."""
    key = (str(opts.seed), completion) if opts.flaw == "shared" else (str(opts.seed), prompt, completion)
    return float(correct or (parsable and unit_hash(*key) < opts.false_accept))


def draw_audits(n: int, rho: float, generator: torch.Generator | None = None) -> Tensor:
    """O [N] in {0, 1}: Bernoulli(rho) per sample; rho = 1 audits all (None: torch's global generator)."""
    return (torch.rand(n, generator=generator) < rho).float()


def corrected_reward(v: Tensor, c: Tensor, audited: Tensor, rho: float, mu: float, variant: str = "minimal") -> Tensor:
    """The audit-corrected reward; rows with audited = 0 get exactly V."""
    weight = mu * audited / rho
    if variant == "symmetric":
        return v + weight * (c - v)
    return v - weight * v * (1.0 - c)


@rewards.register("audit_correction", needs=("rl",), options=AuditOptions)
def audit_correction(task, examples, completions, finished, *, rl) -> Tensor:
    """The imperfect verifier's reward, corrected on a random audited subset by the true correctness."""
    opts: AuditOptions = rl.options_for("audit_correction")
    c = torch.tensor([task.correctness_reward(y, f, e) for y, f, e in zip(completions, finished, examples)])
    v = torch.tensor([
        imperfect_verifier(bool(ci), task.parse(y) is not None, e.prompt, y, opts) for ci, y, e in zip(c, completions, examples)
    ])
    audited = draw_audits(len(completions), opts.audit_rate)
    return corrected_reward(v, c, audited, opts.audit_rate, opts.mu, opts.variant)
