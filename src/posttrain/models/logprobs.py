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
    if not full:
        logp, spread = token_logprobs(logits, completion_ids, temperature, entropy)
        return CompletionOutputs(logp, None, states, spread)
    logp_all = torch.log_softmax(logits.float() / temperature, dim=-1)
    logp = logp_all.gather(-1, completion_ids[..., None]).squeeze(-1)
    spread = None
    if entropy:
        with torch.no_grad():
            spread = -(logp_all.exp() * logp_all).sum(-1)
    return CompletionOutputs(logp, logp_all, states, spread)


CHUNK_ROWS = 8  # rows of logits a chunk: 8 x a 49,152-token vocabulary in float32 is 1.5 MiB, an L2 cache's worth


def token_logprobs(logits: Tensor, ids: Tensor, temperature: float = 1.0, entropy: bool = False) -> tuple[Tensor, Tensor | None]:
    """log softmax(logits / temperature)[ids] in float32 ([...] for logits [..., V] and ids [...]) with its gradient,
    and the distribution's entropy (detached) when asked: what `log_softmax(logits.float() / T).gather(ids)` gives,
    computed a chunk of rows at a time so the float32 [..., V] log-distribution is never materialised. The forward
    keeps the logits and each row's log-normaliser; the backward rebuilds each chunk's softmax from them, in cache, and
    writes d logits = (onehot(ids) - softmax) * grad / T in the logits' dtype. At a 49,152-token vocabulary the
    unfused ops make a dozen passes over a [rows, V] float32 tensor in DRAM, the fused ones read the logits twice and
    write their gradient once."""
    logp, spread = _TokenLogprobs.apply(logits, ids, float(temperature), entropy)
    return logp, (spread if entropy else None)


def _load(buffer: Tensor, logits: Tensor, temperature: float) -> Tensor:
    """`logits / temperature` in float32, written into the first rows of a reused buffer (no allocation per chunk)."""
    x = buffer[: logits.shape[0]].copy_(logits)
    return x if temperature == 1.0 else x.div_(temperature)


class _TokenLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: Tensor, ids: Tensor, temperature: float, entropy: bool) -> tuple[Tensor, Tensor]:  # noqa: ANN001 (ctx)
        flat, picked = logits.reshape(-1, logits.shape[-1]), ids.reshape(-1, 1)
        rows = flat.shape[0]
        logp = torch.empty(rows, 1, dtype=torch.float32, device=logits.device)
        lse = torch.empty_like(logp)
        spread = torch.empty_like(logp) if entropy else logp.new_empty(0)
        scaled = flat.new_empty((min(CHUNK_ROWS, rows), flat.shape[1]), dtype=torch.float32)
        shifted = torch.empty_like(scaled)
        for start in range(0, rows, CHUNK_ROWS):
            stop = min(start + CHUNK_ROWS, rows)
            x = _load(scaled, flat[start:stop], temperature)
            top = x.amax(-1, keepdim=True)
            e = torch.sub(x, top, out=shifted[: stop - start]).exp_()
            total = e.sum(-1, keepdim=True)
            norm = top + total.log()  # logsumexp
            lse[start:stop] = norm
            logp[start:stop] = x.gather(1, picked[start:stop]) - norm
            if entropy:  # H = -sum p (x - lse) = lse - sum p x, with p = e / total
                spread[start:stop] = norm - e.mul_(x).sum(-1, keepdim=True) / total
        ctx.save_for_backward(logits, ids, lse)
        ctx.temperature = temperature
        spread = spread.view(ids.shape) if entropy else spread
        ctx.mark_non_differentiable(spread)
        return logp.view(ids.shape), spread

    @staticmethod
    def backward(ctx, grad: Tensor, _spread: Tensor | None) -> tuple[Tensor | None, None, None, None]:  # noqa: ANN001 (ctx)
        logits, ids, lse = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        flat, picked, g = logits.reshape(-1, logits.shape[-1]), ids.reshape(-1, 1), grad.reshape(-1, 1).float() / ctx.temperature
        out = torch.empty_like(flat)
        scaled = flat.new_empty((min(CHUNK_ROWS, flat.shape[0]), flat.shape[1]), dtype=torch.float32)
        for start in range(0, flat.shape[0], CHUNK_ROWS):
            stop = min(start + CHUNK_ROWS, flat.shape[0])
            softmax = _load(scaled, flat[start:stop], ctx.temperature).sub_(lse[start:stop]).exp_()
            gs = g[start:stop]
            out[start:stop] = softmax.mul_(-gs).scatter_add_(1, picked[start:stop], gs)
        return out.view_as(logits), None, None, None


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
    return token_logprobs(logits, ids[:, 1:], temperature)[0]
