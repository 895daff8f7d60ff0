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

import torch
from pydantic import Field
from torch import Tensor

from posttrain.config import Section
from posttrain.objectives import auxiliaries
from posttrain.models.decoders import positions_from_mask


class ROFTOptions(Section):
    weight: float = Field(ge=0)
    max_tokens: int = Field(gt=0)  # retrospection length budget
    temperature: float = Field(gt=0)  # sampling temperature of the retrospection


def retrospection_nll(model, retro: Tensor) -> Tensor:
    """retro [B, 3, W] = (ids, attention mask, loss mask) -> mean NLL over loss-mask tokens (0 if none)."""
    ids, attention, loss_mask = retro[:, 0], retro[:, 1], retro[:, 2]
    logits = model(input_ids=ids, attention_mask=attention, position_ids=positions_from_mask(attention)).logits[:, :-1]
    logp = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    m = loss_mask[:, 1:].to(logp.dtype)
    if m.sum() == 0:
        return logp.sum() * 0.0  # keeps the graph, contributes nothing
    return -(logp * m).sum() / m.sum()


@auxiliaries.register("roft", needs=("retrospections",), options=ROFTOptions)
def roft(run, batch):
    opts: ROFTOptions = run.cfg.options_for("roft")
    retro = batch.extras["retrospections"]
    value = retrospection_nll(run.policy, retro)
    return opts.weight * value, {"roft/nll": float(value.detach()), "roft/tokens": float(retro[:, 2].sum())}
