"""Log-probabilities of given completions under a model, with gradient (one forward pass)."""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import PreTrainedModel

from posttrain.models.decoders import FastLlamaDecoder, positions_from_mask, shared_prompts


def completion_logprobs(
    model: PreTrainedModel,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    completion_ids: Tensor,
    completion_mask: Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Sampled-token log-probs [B, T] of `completion_ids` after left-padded prompts, and optionally the
    per-token entropy [B, T] (detached). Logits are divided by `temperature`, as at sampling time."""
    shared = shared_prompts(prompt_ids, prompt_mask) if FastLlamaDecoder.supports(model) else None
    if shared is not None:
        # G rows share each prompt (a GRPO group): encode the prompt once, not G times
        starts, counts = shared
        logits = FastLlamaDecoder(model).completion_logits(prompt_ids[starts], prompt_mask[starts], completion_ids, counts)
    else:
        ids = torch.cat([prompt_ids, completion_ids], dim=1)
        mask = torch.cat([prompt_mask, completion_mask.to(prompt_mask.dtype)], dim=1)
        width = completion_ids.shape[1]
        # logits at positions P-1 .. P+T-2 predict the T completion tokens; skip the lm_head elsewhere
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions_from_mask(mask), logits_to_keep=width + 1).logits[:, :-1]
    logp_all = torch.log_softmax(logits.float() / temperature, dim=-1)
    logp = logp_all.gather(-1, completion_ids[..., None]).squeeze(-1)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy
