"""Batched sampling: G completions per prompt, with the sampled tokens' log-probs captured on the way.

The log-prob of each sampled token under the (temperature-scaled) sampling distribution is recorded
while sampling, so an on-policy update needs no second forward pass to get `old_logp`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import PreTrainedModel

from posttrain.rollout.decoders import decoder_for


@dataclass(frozen=True)
class Samples:
    completion_ids: Tensor  # [N, T] with N = prompts * group_size; pad after EOS
    completion_mask: Tensor  # [N, T] 1 on produced tokens, EOS included
    logp: Tensor  # [N, T] log-prob of each produced token under the sampling distribution (0 on padding)
    finished: Tensor  # [N] True when the completion ended with EOS within the budget


@torch.no_grad()
def sample(
    model: PreTrainedModel,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    *,
    group_size: int,
    max_new_tokens: int,
    eos_id: int,
    pad_id: int,
    temperature: float = 1.0,
    greedy: bool = False,
    generator: torch.Generator | None = None,
) -> Samples:
    """Sample `group_size` completions for each prompt row of `prompt_ids` (left-padded)."""
    was_training = model.training
    model.eval()
    decoder = decoder_for(model)
    logits = decoder.prefill(prompt_ids, prompt_mask, group_size, max_new_tokens)
    n = logits.shape[0]
    device = prompt_ids.device
    tokens = torch.empty(n, max_new_tokens, dtype=torch.long, device=device)
    logps = torch.empty(n, max_new_tokens, dtype=torch.float32, device=device)
    ended = torch.zeros(n, dtype=torch.bool, device=device)
    steps = 0
    # the loop only samples and records; masking after EOS happens once, at the end
    for t in range(max_new_tokens):
        logp_all = torch.log_softmax(logits if temperature == 1.0 else logits / temperature, dim=-1)
        token = logp_all.argmax(-1) if greedy else categorical(logp_all, generator)
        tokens[:, t] = token
        logps[:, t] = logp_all.gather(-1, token[:, None]).squeeze(-1)
        steps = t + 1
        ended |= token == eos_id
        if steps == max_new_tokens or bool(ended.all()):
            break
        logits = decoder.step(token)
    model.train(was_training)
    tokens, logps = tokens[:, :steps], logps[:, :steps]
    # produced = up to and including the first EOS
    produced = torch.ones_like(tokens, dtype=torch.bool)
    produced[:, 1:] = (tokens[:, :-1] != eos_id).cumprod(-1).bool()
    finished = ((tokens == eos_id) & produced).any(-1)
    tokens = tokens.masked_fill(~produced, pad_id)
    logps = logps.masked_fill(~produced, 0.0)
    return Samples(tokens, produced.long(), logps, finished)


def categorical(logp: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """One draw per row from the distribution with log-probs `logp` [N, V], by inverting its CDF with one
    uniform number per row (`torch.multinomial` draws V exponentials per row)."""
    cdf = logp.exp().cumsum(-1)
    u = torch.rand(logp.shape[0], 1, generator=generator, device=logp.device, dtype=cdf.dtype) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp_(max=logp.shape[-1] - 1)
