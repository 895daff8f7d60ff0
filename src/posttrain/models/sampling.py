"""Batched sampling: G completions per prompt, with the sampled tokens' log-probs captured on the way.

The log-prob of each sampled token under the (temperature-scaled) sampling distribution is recorded
while sampling, so an on-policy update needs no second forward pass to get `old_logp`. `generate` is the
one encode -> sample -> decode helper every loop uses (rollouts, teachers' traces, evaluation, reward models).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from posttrain.models.decoders import decoder_for


@dataclass(frozen=True)
class Samples:
    completion_ids: Tensor  # [N, T] with N = prompts * group_size; pad after EOS
    completion_mask: Tensor  # [N, T] 1 on tokens the policy produced, EOS included (the loss mask)
    logp: Tensor  # [N, T] log-prob of each produced token under the sampling distribution (0 elsewhere)
    finished: Tensor  # [N] True when the completion ended with EOS within the budget
    attention_mask: Tensor | None = None  # [N, T] 1 on every real token, environment observations included

    @property
    def attention(self) -> Tensor:
        """The attention mask over the completion (equal to `completion_mask` for single-turn samples)."""
        return self.completion_mask if self.attention_mask is None else self.attention_mask


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


def decode_completions(tokenizer: PreTrainedTokenizerBase, samples: Samples) -> list[str]:
    """The produced text of each completion, without EOS, padding or environment observations."""
    ids = samples.completion_ids.masked_fill(samples.completion_mask == 0, tokenizer.pad_token_id)
    return tokenizer.batch_decode(ids.cpu(), skip_special_tokens=True)


def encode_prompts(tokenizer: PreTrainedTokenizerBase, prompts: list[str], device: torch.device) -> tuple[Tensor, Tensor]:
    """Left-padded prompt ids and attention mask."""
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    return enc.input_ids.to(device), enc.attention_mask.to(device)


@torch.no_grad()
def generate(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompts: list[str], max_new_tokens: int, *, group_size: int = 1,
    temperature: float = 1.0, greedy: bool = False, generator: torch.Generator | None = None, sampler=None, chunk: int = 0,
) -> tuple[Samples, list[str]]:
    """`group_size` completions of each prompt text (rows prompt-major: prompt i's samples are rows i*G .. i*G+G-1)
    and their decoded texts. `sampler` replaces `sample` (a multi-turn environment's episode sampler); `chunk` > 0
    generates at most that many prompts at a time (bounded memory), concatenating the results."""
    draw = sampler or sample
    device = next(model.parameters()).device
    step = chunk if chunk > 0 else max(len(prompts), 1)
    parts = []
    for start in range(0, len(prompts), step):
        ids, mask = encode_prompts(tokenizer, prompts[start : start + step], device)
        parts.append(draw(
            model, ids, mask, group_size=group_size, max_new_tokens=max_new_tokens, eos_id=tokenizer.eos_token_id,
            pad_id=tokenizer.pad_token_id, temperature=temperature, greedy=greedy, generator=generator,
        ))
    samples = parts[0] if len(parts) == 1 else concat_samples(parts, tokenizer.pad_token_id)
    return samples, decode_completions(tokenizer, samples)


def concat_samples(parts: list[Samples], pad_id: int) -> Samples:
    """Row-wise concatenation of samples of different widths (padded on the right)."""
    width = max(p.completion_ids.shape[1] for p in parts)

    def pad(t: Tensor, value) -> Tensor:
        return torch.nn.functional.pad(t, (0, width - t.shape[1]), value=value)

    attention = None
    if any(p.attention_mask is not None for p in parts):
        attention = torch.cat([pad(p.attention, 0) for p in parts])
    return Samples(
        torch.cat([pad(p.completion_ids, pad_id) for p in parts]), torch.cat([pad(p.completion_mask, 0) for p in parts]),
        torch.cat([pad(p.logp, 0.0) for p in parts]), torch.cat([p.finished for p in parts]), attention,
    )
