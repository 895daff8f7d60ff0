"""The generation engine: one token-decode loop for every rollout.

A model's incremental decoder (models/decoders.py: prefill once, then one token per step, positions counting real
tokens only) is driven here, the one place that samples, records each produced token's log-prob under the sampling
distribution (so an on-policy update needs no second forward for `old_logp`), ends rows at EOS or a stop string, and
calls the hooks:

- `between_steps(t)` runs before the forward that produces token t's logits (t >= 1): an asynchronous rollout worker
  loads newer weights there (trainers/async_rl.py), and the rest of the rollout decodes under them;
- an `Environment` answers each token the policy produces (multi-turn: envs/rollout.py). Its observation is fed
  through the same KV cache, one token per step, as tokens the policy did not produce (log-prob 0, loss mask 0), so
  a turn costs its new tokens only instead of re-encoding the transcript;
- `embeds` replaces the prompt's token ids by input embeddings (soft-token models: encoder outputs spliced in front
  of the words, `sample_soft_tokens`), after which decoding proceeds from token ids as usual; `prompt_inputs` are
  further inputs of the prompt's forward (a native image-text model's pixel values).

The loop only samples and records; masking after a row's end happens once, at the end.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor
from transformers import PreTrainedModel

from posttrain.models.decoders import CUDA_GRAPHS, FastLlamaDecoder, decoder_for, unwrap
from posttrain.models.precision import autocast
from posttrain.models.soft_tokens import SoftTokenLM


@dataclass(frozen=True)
class Samples:
    completion_ids: Tensor  # [N, T] with N = prompts * group_size; pad after EOS
    completion_mask: Tensor  # [N, T] 1 on tokens the policy produced, EOS included (the loss mask)
    logp: Tensor  # [N, T] log-prob of each produced token under the sampling distribution (0 elsewhere)
    finished: Tensor  # [N] True when the completion ended with EOS within the budget
    attention_mask: Tensor | None = None  # [N, T] 1 on every real token, environment observations included
    extras: Mapping[str, Tensor] = field(default_factory=dict)  # [N, ...] what the policy recorded per sample beyond tokens (batch extras)

    @property
    def attention(self) -> Tensor:
        """The attention mask over the completion (equal to `completion_mask` for single-turn samples)."""
        return self.completion_mask if self.attention_mask is None else self.attention_mask


class Environment(Protocol):
    def respond(self, row: int, token: int) -> tuple[Sequence[int], bool]:
        """(observation token ids, whether the episode is over) after row `row` produced `token`. An observation that
        ends the episode (or the token budget) is recorded but not fed."""
        ...


def categorical(logp: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """One draw per row from the distribution with log-probs `logp` [N, V] (`invert_cdf` on its probabilities)."""
    return invert_cdf(logp.exp(), generator)[0]


CDF_BLOCK = 128  # vocabulary entries a block of the two-level CDF


def invert_cdf(weights: Tensor, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """One draw per row from the distribution proportional to `weights` [N, V] (non-negative, finite), by inverting its
    CDF with one uniform number per row (`torch.multinomial` draws V exponentials per row), and each row's total [N, 1].

    The CDF is inverted in two levels: the cumulative sums of blocks of `CDF_BLOCK` entries pick the block, then the
    cumulative sum inside that block picks the entry. A flat cumsum over the vocabulary is a sequential scan that
    dominated the sampler's step (9.5 ms of a 64 x 49,152 draw on one core, about the head matmul's cost); block sums
    vectorise. The uniform is kept strictly below each level's total, so an entry of zero weight is never drawn."""
    n, v = weights.shape
    width = CDF_BLOCK if v % CDF_BLOCK == 0 else v  # otherwise one block: the flat CDF
    blocks = weights.view(n, v // width, width)
    cdf = blocks.sum(-1).cumsum(-1)  # [N, blocks]
    total = cdf[:, -1:]
    u = torch.rand(n, 1, generator=generator, device=weights.device, dtype=cdf.dtype) * total
    u = torch.minimum(u, torch.nextafter(total, torch.zeros_like(total)))
    block = torch.searchsorted(cdf, u, right=True).clamp_(max=cdf.shape[1] - 1)
    before = torch.where(block > 0, cdf.gather(1, (block - 1).clamp(min=0)), torch.zeros_like(u))
    inner = blocks[torch.arange(n, device=weights.device), block.squeeze(1)].cumsum(-1)  # [N, width]
    rest = torch.minimum(u - before, torch.nextafter(inner[:, -1:], torch.zeros_like(total)))
    entry = torch.searchsorted(inner, rest.clamp_(min=0), right=True).clamp_(max=width - 1)
    return (block * width + entry).squeeze(1), total


@torch.no_grad()
def sample(
    model: PreTrainedModel,
    prompt_ids: Tensor | None,
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
    env: Environment | None = None,
    embeds: Tensor | None = None,
    prompt_inputs: Mapping[str, Tensor] | None = None,
) -> Samples:
    """Sample `group_size` completions for each prompt row of `prompt_ids` (left-padded; or of `embeds` [B, P, H]
    under `prompt_mask`). A row ends at EOS or when `stop(tokens so far)` [N, t] -> [N] bool (a `StopStrings`) says
    its text now holds a stop string, or when `env` ends its episode. `cuda_graph` (default: the model's
    `model.cuda_graphs`, see `models.decoders.use_cuda_graphs`) replays each decode step as a CUDA graph where the
    decoder supports it; elsewhere it is ignored. With `env`, `max_new_tokens` bounds the transcript (actions and
    observations): an episode that reaches it ends unfinished."""
    was_training = model.training
    model.eval()
    decoder = decoder_for(model)
    if cuda_graph is None:
        cuda_graph = getattr(unwrap(model), CUDA_GRAPHS, False)
    graphed = cuda_graph and prompt_mask.device.type == "cuda" and isinstance(decoder, FastLlamaDecoder) and _no_autocast(model)
    options = {"static": True} if graphed else {}
    if embeds is not None:
        options["embeds"] = embeds
    options.update(prompt_inputs or {})
    with autocast(model):
        logits = decoder.prefill(prompt_ids, prompt_mask, group_size, max_new_tokens, **options)
    n = logits.shape[0]
    device = prompt_mask.device
    tokens = torch.empty(n, max_new_tokens, dtype=torch.long, device=device)
    logps = torch.empty(n, max_new_tokens, dtype=torch.float32, device=device)
    ended = torch.zeros(n, dtype=torch.bool, device=device)
    last = torch.full((n,), max_new_tokens, dtype=torch.long, device=device)  # index of each row's last produced token
    turns = _Turns(env, n, device) if env is not None else None
    steps = 0
    # every step's softmax numerator goes into one buffer: a fresh [N, V] float32 tensor per step is first-touched
    # page by page (64 x 49,152 on 2 threads: 7-13 ms a draw, against 3.4-4.7 ms reused)
    numerator = None
    for t in range(max_new_tokens):
        scaled = logits if temperature == 1.0 else logits / temperature
        top = scaled.amax(-1, keepdim=True)
        if numerator is None or numerator.shape != scaled.shape or numerator.dtype != scaled.dtype:
            numerator = torch.empty_like(scaled)
        weights = torch.sub(scaled, top, out=numerator).exp_()  # softmax's numerator; log-softmax = scaled - top - log(total)
        if greedy:
            token, total = scaled.argmax(-1), weights.sum(-1, keepdim=True)
        else:
            token, total = invert_cdf(weights, generator)
        if turns is not None:
            token = turns.feed(token)
        tokens[:, t] = token
        logps[:, t] = (scaled.gather(-1, token[:, None]) - top - total.log()).squeeze(-1)
        steps = t + 1
        hit = token == eos_id
        if stop is not None:
            hit |= stop(tokens[:, :steps])
        if turns is not None:
            hit = turns.respond(token, hit, ended, steps, max_new_tokens)
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
    if turns is None:
        return Samples(tokens, produced.long(), logps.masked_fill(~produced, 0.0), ended)
    return turns.samples(tokens, logps, produced, pad_id)


def sample_soft_tokens(lm: SoftTokenLM, soft: Tensor, prompt_ids: Tensor, prompt_mask: Tensor, max_new_tokens: int, temperature: float,
                       generator: torch.Generator | None = None) -> Samples:
    """One completion per row of a soft-token model: `soft` [B, N, H] encoder tokens in front of left-padded prompts
    (`SoftTokenLM.splice`), decoded by its language model; temperature 0 is greedy."""
    embeds, mask = lm.splice(soft, prompt_ids, prompt_mask)
    tokenizer = lm.tokenizer
    return sample(
        lm.language_model, None, mask, embeds=embeds, group_size=1, max_new_tokens=max_new_tokens, eos_id=tokenizer.eos_token_id,
        pad_id=tokenizer.pad_token_id, temperature=temperature if temperature > 0 else 1.0, greedy=temperature <= 0, generator=generator,
    )


def _no_autocast(model: PreTrainedModel) -> bool:
    return isinstance(autocast(model), nullcontext)


class _Turns:
    """The environment side of `sample`: which tokens the policy produced, the observations still to feed, how
    each episode ended, and the observations that came with an episode's end (recorded, never fed)."""

    def __init__(self, env: Environment, rows: int, device: torch.device):
        self.env, self.device = env, device
        self.pending: list[list[int]] = [[] for _ in range(rows)]
        self.policy_columns: list[Tensor] = []  # [N] bool per step: the policy produced this token
        self.finished = torch.zeros(rows, dtype=torch.bool, device=device)
        self.tails: list[list[int]] = [[] for _ in range(rows)]

    def feed(self, sampled: Tensor) -> Tensor:
        """This step's tokens: the next observation token where one is pending, else the sampled one."""
        acted = [not queue for queue in self.pending]
        self.policy_columns.append(torch.tensor(acted, device=self.device))
        if all(acted):
            return sampled
        forced = [queue.pop(0) if queue else 0 for queue in self.pending]
        return torch.where(self.policy_columns[-1], sampled, torch.tensor(forced, device=self.device))

    def respond(self, token: Tensor, hit: Tensor, ended: Tensor, length: int, budget: int) -> Tensor:
        """Rows that end at this step: EOS (or a stop string) on a policy token, the environment's end, or the budget."""
        acted = self.policy_columns[-1]
        hit = hit & acted
        self.finished |= hit & ~ended
        over = hit.clone()
        values, live = token.tolist(), (acted & ~hit & ~ended).nonzero().flatten().tolist()
        for row in live:
            observation, done = self.env.respond(row, values[row])
            if done or length + len(observation) >= budget:
                self.tails[row] = list(observation)
                over[row] = True
                self.finished[row] = done
            else:
                self.pending[row] = list(observation)
        return over

    def samples(self, tokens: Tensor, logps: Tensor, produced: Tensor, pad_id: int) -> Samples:
        """The transcripts: fed tokens up to each row's end, then its closing observation; the loss mask and the
        log-probs on policy tokens only, the attention mask on every real token."""
        acted = torch.stack(self.policy_columns, dim=1) & produced
        lengths = produced.sum(-1).tolist()
        width = max(n + len(tail) for n, tail in zip(lengths, self.tails))
        rows = tokens.shape[0]
        ids = torch.full((rows, width), pad_id, dtype=torch.long, device=self.device)
        policy = torch.zeros(rows, width, dtype=torch.long, device=self.device)
        attention = torch.zeros_like(policy)
        logp = torch.zeros(rows, width, device=self.device)
        steps = tokens.shape[1]
        ids[:, :steps], policy[:, :steps] = tokens, acted.long()
        logp[:, :steps] = logps.masked_fill(~acted, 0.0)
        for row, (n, tail) in enumerate(zip(lengths, self.tails)):
            ids[row, n : n + len(tail)] = torch.tensor(tail, dtype=torch.long, device=self.device)
            attention[row, : n + len(tail)] = 1
        return Samples(ids, policy, logp, self.finished, attention)
