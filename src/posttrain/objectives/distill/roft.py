"""ROFT, Retrospection-Only Fine-Tuning (2026; derived from its abstract): the agent attempts a task,
sees the environment's feedback, writes a retrospective explanation on-policy, and is fine-tuned with the
next-token loss on the explanation tokens only:

    rho ~ pi_theta(. | retro_prompt(task, attempt, feedback))          (sampled fresh each update)
    L   = - mask-mean_t log pi_theta(rho_t | retro_prompt, rho_<t)      (mask 1 on rho's tokens only)

No teacher, no advantage, no reward scalar: the loss reads only the retrospection tokens, so successful and
failed attempts differ only through their text. An empty retrospection contributes 0 (no NaN).
Use with `rl.loss: none` (the `roft` preset). Settings: rl.options.roft.
"""

from __future__ import annotations

from pydantic import Field
from torch import Tensor

from posttrain.config import Section
from posttrain.objectives import auxiliaries


class ROFTOptions(Section):
    weight: float = Field(1.0, ge=0)
    max_tokens: int = Field(6, gt=0)  # retrospection length budget
    temperature: float = Field(1.0, gt=0)  # sampling temperature of the retrospection


def retrospection_nll(logp: Tensor, retro: Tensor) -> Tensor:
    """Mean NLL over loss-mask tokens (0 if none): `logp` [B, W-1] are the policy's log-probs of the tokens of
    retro [B, 3, W] = (ids, attention mask, loss mask) after their prefixes (the trainer's forward scores them)."""
    m = retro[:, 2, 1:].to(logp.dtype)
    if m.sum() == 0:
        return logp.sum() * 0.0  # keeps the graph, contributes nothing
    return -(logp * m).sum() / m.sum()


@auxiliaries.register("roft", needs=("retrospections",), scores=("retrospections",), options=ROFTOptions)
def roft(batch, policy, cfg, module=None):
    opts: ROFTOptions = cfg.options_for("roft")
    retro = batch.extras["retrospections"]
    value = retrospection_nll(policy.scored["retrospections"], retro)
    return opts.weight * value, {"roft/nll": float(value.detach()), "roft/tokens": float(retro[:, 2].sum())}
