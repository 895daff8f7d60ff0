"""Log-probabilities of given completions under a model: the one forward pass every role shares.

A completion is read after its left-padded prompt with the ATTENTION mask of the completion (every real
token, environment observations included), never the loss mask: a multi-turn episode is read with its
observations in place, so positions and context match what the sampler saw. Logits are divided by the
sampling temperature. For each completion token y_t the outputs are taken at the position that predicts it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import PreTrainedModel

from posttrain.models.decoders import FastLlamaDecoder, positions_from_mask, shared_prompts, sharded
from posttrain.models.precision import autocast, checkpointing


@dataclass(frozen=True)
class CompletionOutputs:
    logp: Tensor  # [B, T] log pi(y_t | context, y_<t)
    logprobs: Tensor | None = None  # [B, T, V] the full temperature-scaled log-distribution (when asked)
    hidden: Tensor | None = None  # [L, B, T, d] each decoder layer's output at the position predicting y_t (when asked)
    entropy: Tensor | None = None  # [B, T] detached (when asked)


def completion_forward(
    model: PreTrainedModel, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor, attention_mask: Tensor,
    temperature: float = 1.0, *, full: bool = False, hidden: bool = False, entropy: bool = False,
) -> CompletionOutputs:
    """One forward pass over `prompt + completion` (with gradient if the caller has it on). When G consecutive
    rows share a prompt and the model is Llama-family, the prompt is encoded once (FastLlamaDecoder); hidden
    states come from `model.forward`, and so does everything under activation checkpointing (which wraps the
    decoder layers the shared-prompt path goes around) or FSDP (whose units gather their shards in their forward hooks,
    which that path goes around too)."""
    fast = not hidden and not checkpointing(model) and not sharded(model) and FastLlamaDecoder.supports(model)
    shared = shared_prompts(prompt_ids, prompt_mask) if fast else None
    states = None
    if shared is not None:
        starts, counts = shared
        with autocast(model):
            logits = FastLlamaDecoder(model).completion_logits(prompt_ids[starts], prompt_mask[starts], completion_ids, counts)
    else:
        ids = torch.cat([prompt_ids, completion_ids], dim=1)
        mask = torch.cat([prompt_mask, attention_mask.to(prompt_mask.dtype)], dim=1)
        width = completion_ids.shape[1]
        # logits at positions P-1 .. P+T-2 predict the T completion tokens; skip the lm_head elsewhere
        out = model(
            input_ids=ids, attention_mask=mask, position_ids=positions_from_mask(mask), output_hidden_states=hidden, logits_to_keep=width + 1
        )
        logits = out.logits[:, :-1]
        if hidden:
            start = prompt_ids.shape[1] - 1
            states = torch.stack([h[:, start : start + width] for h in out.hidden_states[1:]])
    logp_all = torch.log_softmax(logits.float() / temperature, dim=-1)
    logp = logp_all.gather(-1, completion_ids[..., None]).squeeze(-1)
    spread = None
    if entropy:
        with torch.no_grad():
            spread = -(logp_all.exp() * logp_all).sum(-1)
    return CompletionOutputs(logp, logp_all if full else None, states, spread)


def completion_logprobs(
    model: PreTrainedModel, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor, attention_mask: Tensor,
    temperature: float = 1.0, with_entropy: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Sampled-token log-probs [B, T] and optionally the per-token entropy [B, T] (detached)."""
    out = completion_forward(model, prompt_ids, prompt_mask, completion_ids, attention_mask, temperature, entropy=with_entropy)
    return out.logp, out.entropy


def sequence_logprobs(model: PreTrainedModel, ids: Tensor, attention_mask: Tensor, temperature: float = 1.0) -> Tensor:
    """[B, W-1] log-prob of each token ids[:, 1:] after everything before it (left- or right-padded rows)."""
    logits = model(input_ids=ids, attention_mask=attention_mask, position_ids=positions_from_mask(attention_mask)).logits[:, :-1]
    return torch.log_softmax(logits.float() / temperature, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
