"""Batched sampling: G completions per prompt, with the sampled tokens' log-probs captured on the way.

The log-prob of each sampled token under the (temperature-scaled) sampling distribution is recorded
while sampling, so an on-policy update needs no second forward pass to get `old_logp`. `generate` is the
one encode -> sample -> decode helper every loop uses (rollouts, teachers' traces, evaluation, reward models).
Prompts are encoded by models/chat.py (chat template or raw text). Stop strings (`rl.stop`, `eval.stop`) end a
row like EOS does, on the token that completes one; its text is cut before the stop string.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from posttrain.models.chat import encode_prompts
from posttrain.models.decoders import FastLlamaDecoder, decoder_for, unwrap
from posttrain.models.precision import autocast

__all__ = [
    "Samples", "StopStrings", "categorical", "concat_samples", "decode_completions", "encode_prompts", "generate", "sample", "use_cuda_graphs",
]
_CUDA_GRAPHS = "posttrain_cuda_graphs"  # model attribute: `model.cuda_graphs`, read by every `sample` of the model


def use_cuda_graphs(model: PreTrainedModel, enabled: bool) -> None:
    """Make `sample` replay the model's decode steps as CUDA graphs (`model.cuda_graphs`), where it can: a
    Llama-family model on a CUDA device without autocast (autocast's weight cache cannot be captured)."""
    setattr(unwrap(model), _CUDA_GRAPHS, enabled)


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
    stop: Callable[[Tensor], Tensor] | None = None,
    between_steps: Callable[[int], None] | None = None,
    cuda_graph: bool | None = None,
) -> Samples:
    """Sample `group_size` completions for each prompt row of `prompt_ids` (left-padded). A row ends at EOS or
    when `stop(tokens so far)` [N, t] -> [N] bool (a `StopStrings`) says its text now holds a stop string.
    `between_steps(t)` runs before the forward that produces token t's logits (t >= 1): an asynchronous rollout
    worker loads newer weights there (trainers/async_rl.py), and the rest of the rollout decodes under them.
    `cuda_graph` (default: the model's `model.cuda_graphs`) replays each decode step as a CUDA graph where the
    decoder supports it (see `use_cuda_graphs`); elsewhere it is ignored."""
    was_training = model.training
    model.eval()
    decoder = decoder_for(model)
    if cuda_graph is None:
        cuda_graph = getattr(unwrap(model), _CUDA_GRAPHS, False)
    graphed = cuda_graph and prompt_ids.device.type == "cuda" and isinstance(decoder, FastLlamaDecoder) and _no_autocast(model)
    with autocast(model):
        logits = decoder.prefill(prompt_ids, prompt_mask, group_size, max_new_tokens, **({"static": True} if graphed else {}))
    n = logits.shape[0]
    device = prompt_ids.device
    tokens = torch.empty(n, max_new_tokens, dtype=torch.long, device=device)
    logps = torch.empty(n, max_new_tokens, dtype=torch.float32, device=device)
    ended = torch.zeros(n, dtype=torch.bool, device=device)
    last = torch.full((n,), max_new_tokens, dtype=torch.long, device=device)  # index of each row's last produced token
    steps = 0
    # the loop only samples and records; masking after the end happens once, at the end
    for t in range(max_new_tokens):
        logp_all = torch.log_softmax(logits if temperature == 1.0 else logits / temperature, dim=-1)
        token = logp_all.argmax(-1) if greedy else categorical(logp_all, generator)
        tokens[:, t] = token
        logps[:, t] = logp_all.gather(-1, token[:, None]).squeeze(-1)
        steps = t + 1
        hit = token == eos_id
        if stop is not None:
            hit |= stop(tokens[:, :steps])
        last = torch.where(hit & ~ended, t, last)
        ended |= hit
        if steps == max_new_tokens or bool(ended.all()):
            break
        if between_steps is not None:
            between_steps(steps)
        with autocast(model):
            logits = decoder.step(token)
    model.train(was_training)
    tokens, logps = tokens[:, :steps], logps[:, :steps]
    produced = torch.arange(steps, device=device)[None, :] <= last[:, None]  # up to and including the end
    tokens = tokens.masked_fill(~produced, pad_id)
    logps = logps.masked_fill(~produced, 0.0)
    return Samples(tokens, produced.long(), logps, ended)


def _no_autocast(model: PreTrainedModel) -> bool:
    return isinstance(autocast(model), nullcontext)


class StopStrings:
    """`stop` strings as a sampler's stop test: a row stops on the token after which its decoded text holds one
    (each step decodes only the last few tokens of every row); `cut` removes a stop string and what follows."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stop: Sequence[str]):
        self.tokenizer, self.stop = tokenizer, tuple(s for s in stop if s)
        self.window = max((len(s.encode()) for s in self.stop), default=0) + 1  # a token holds at least one byte

    def __bool__(self) -> bool:
        return bool(self.stop)

    def __call__(self, tokens: Tensor) -> Tensor:
        return torch.tensor(self.holds(tokens[:, -self.window :].tolist()), device=tokens.device)

    def holds(self, rows: Sequence[Sequence[int]]) -> list[bool]:
        """Whether the text of each row's last tokens (rows of any length) holds a stop string."""
        tails = self.tokenizer.batch_decode([list(r)[-self.window :] for r in rows], skip_special_tokens=True)
        return [any(s in tail for s in self.stop) for tail in tails]

    def cut(self, text: str) -> str:
        ends = [i for i in (text.find(s) for s in self.stop) if i >= 0]
        return text[: min(ends)] if ends else text


def categorical(logp: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """One draw per row from the distribution with log-probs `logp` [N, V], by inverting its CDF with one
    uniform number per row (`torch.multinomial` draws V exponentials per row)."""
    cdf = logp.exp().cumsum(-1)
    u = torch.rand(logp.shape[0], 1, generator=generator, device=logp.device, dtype=cdf.dtype) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp_(max=logp.shape[-1] - 1)


def decode_completions(tokenizer: PreTrainedTokenizerBase, samples: Samples, stop: StopStrings | None = None) -> list[str]:
    """The produced text of each completion, without EOS, padding or environment observations (and cut before
    a stop string)."""
    ids = samples.completion_ids.masked_fill(samples.completion_mask == 0, tokenizer.pad_token_id)
    texts = tokenizer.batch_decode(ids.cpu(), skip_special_tokens=True)
    return [stop.cut(t) for t in texts] if stop else texts


@torch.no_grad()
def generate(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompts: Sequence, max_new_tokens: int, *, group_size: int = 1,
    temperature: float = 1.0, greedy: bool = False, generator: torch.Generator | None = None, sampler=None, chunk: int = 0,
    stop: Sequence[str] = (),
) -> tuple[Samples, list[str]]:
    """`group_size` completions of each prompt (a text or an example; rows prompt-major: prompt i's samples are rows
    i*G .. i*G+G-1) and their decoded texts. `sampler` replaces `sample` (a multi-turn environment's episode
    sampler); `chunk` > 0 generates at most that many prompts at a time (bounded memory), concatenating the
    results; `stop` strings end a completion (`sample` only)."""
    stops = StopStrings(tokenizer, stop)
    draw = sampler or (partial(sample, stop=stops) if stops else sample)
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
    return samples, decode_completions(tokenizer, samples, stops)


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
