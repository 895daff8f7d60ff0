"""Inference-time samplers, registered by name: `eval.sampler` picks one, its settings sit in `eval.options.<name>`.

greedy       argmax decoding (rollout/decode.py `sample`, greedy).
temperature  ancestral sampling from softmax(logits / T), T the caller's temperature (`eval.temperature`).
beam         beam search on the summed log-prob, best finished hypothesis by score / length^length_penalty
             (Wu et al. 2016, "Google's Neural Machine Translation System", arXiv 1609.08144, eq. 14, without the
             coverage term).
power        Metropolis-Hastings power sampling (Karan & Du 2025, arXiv 2510.14901; rollout/power.py).
ppt          Parallel Power Tempering: replicas on a power ladder with replica exchange (rollout/power.py).
ttsd         test-time self-distillation: beam search on base log-prob plus the counterfactual log-odds reward
             over three contexts (rollout/beam.py).

A sampler is `fn(model, tokenizer, prompts, request, options, generator) -> Sampled`: `request.n` answers per
prompt for a stochastic sampler (registry meta `stochastic`), one for a deterministic one; a sampler that can play a
multi-turn task's episodes turn by turn is registered `episodes=True` (the evaluation refuses the others there). Every sampler reports
the forward tokens it spent (tokens run through the model, padding excluded), split into prompt and generated
and, for TTSD, per context, so samplers are compared at matched compute. Stop strings (`request.stop`) end a
sequence of every sampler like EOS, on the token that completes one (an MH proposal, a replica, a beam
hypothesis), so nothing is generated or counted past it; the answer's text is cut before the stop string.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from posttrain.models.chat import encode_prompts
from posttrain.rollout.sampling import Samples, StopStrings, decode_completions, generate
from posttrain.registry import Registry
from posttrain.rollout.power import PowerOptions, PPTOptions, geometric_ladder, run_chains

samplers: Registry = Registry("sampler")
_RATE_OF = {"mh_acceptance": "mh_moves", "swap_acceptance": "swaps"}  # a diagnostic rate -> the count it is over


@dataclass(frozen=True)
class SampleRequest:
    max_new_tokens: int
    n: int = 1  # answers per prompt (stochastic samplers)
    temperature: float = 1.0  # the `temperature` sampler's T
    stop: tuple[str, ...] = ()
    chunk: int = 0  # > 0: at most this many prompts at a time
    episodes: Callable | None = None  # a multi-turn task's episode sampler (`Task.sampler`), for the samplers registered `episodes=True`


@dataclass(frozen=True)
class Sampled:
    samples: Samples  # rows prompt-major: prompt i's answers are rows i*per_prompt .. i*per_prompt+per_prompt-1
    texts: list[str]
    per_prompt: int
    forward_tokens: dict[str, int]  # "prompt", "generated" (TTSD: "<context>_prompt", "<context>_generated" too)
    stats: dict[str, float] = field(default_factory=dict)  # sampler diagnostics (MH and swap acceptance, ...)

    @property
    def total_forward_tokens(self) -> int:
        return self.forward_tokens["prompt"] + self.forward_tokens["generated"]


def with_context(prompt, prefix: str):
    """`prompt` (a text or an example) with `prefix` written before its text (a counterfactual context)."""
    return prefix + prompt if isinstance(prompt, str) else replace(prompt, prompt=prefix + prompt.prompt)


def draw(name: str, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompts: Sequence, request: SampleRequest,
         options=None, generator: torch.Generator | None = None) -> Sampled:
    """Run sampler `name` on `prompts`, `request.chunk` prompts at a time, the chunks' results joined."""
    fn = samplers.get(name)
    step = request.chunk if request.chunk > 0 else max(len(prompts), 1)
    parts = [fn(model, tokenizer, prompts[i : i + step], request, options, generator) for i in range(0, len(prompts), step)]
    if len(parts) == 1:
        return parts[0]
    from posttrain.rollout.sampling import concat_samples

    totals: dict[str, int] = {}
    for part in parts:
        for key, value in part.forward_tokens.items():
            totals[key] = totals.get(key, 0) + value
    stats = {}
    for key in parts[0].stats:  # counts add up, a rate is weighted by its count, anything else is averaged
        count = _RATE_OF.get(key)
        if key in _RATE_OF.values():
            stats[key] = sum(p.stats[key] for p in parts)
        elif count is not None:
            total = sum(p.stats[count] for p in parts)
            stats[key] = sum(p.stats[key] * p.stats[count] for p in parts) / total if total else 0.0
        else:
            stats[key] = sum(p.stats[key] for p in parts) / len(parts)
    return Sampled(concat_samples([p.samples for p in parts], tokenizer.pad_token_id), [t for p in parts for t in p.texts],
                   parts[0].per_prompt, totals, stats)


def samples_from_rows(rows: Sequence[Tensor], logps: Sequence[Tensor], finished: Sequence[bool], pad_id: int, device) -> Samples:
    """Samples from per-row completion tokens (EOS included where a row ended) and their base log-probs."""
    width = max((len(r) for r in rows), default=0)
    ids = torch.full((len(rows), max(width, 1)), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros_like(ids)
    logp = torch.zeros(ids.shape, dtype=torch.float32, device=device)
    for i, (r, lp) in enumerate(zip(rows, logps)):
        ids[i, : len(r)], mask[i, : len(r)], logp[i, : len(r)] = r, 1, lp
    return Samples(ids, mask, logp, torch.tensor(list(finished), dtype=torch.bool, device=device))


def decoded(tokenizer, samples: Samples, stop: Sequence[str]) -> list[str]:
    stops = StopStrings(tokenizer, stop)
    return decode_completions(tokenizer, samples, stops if stops else None)


# --- greedy and temperature: the library's `sample` -------------------------------------------------------------

def _ancestral(model, tokenizer, prompts, request: SampleRequest, greedy: bool, generator) -> Sampled:
    k = 1 if greedy else request.n
    device = next(model.parameters()).device
    _, prompt_mask = encode_prompts(tokenizer, prompts, device)
    samples, texts = generate(model, tokenizer, prompts, request.max_new_tokens, group_size=k, temperature=request.temperature,
                              greedy=greedy, generator=generator, stop=request.stop, sampler=request.episodes)
    steps = samples.completion_ids.shape[1]
    lengths = samples.completion_mask.sum(-1)
    # the prompt is encoded once per prompt (its keys shared by the k rows); a row's produced tokens are fed back
    # except the last one of the longest row, which ends the loop
    generated = int(lengths.clamp(max=max(steps - 1, 0)).sum())
    return Sampled(samples, texts, k, {"prompt": int(prompt_mask.sum()), "generated": generated})


@samplers.register("greedy", stochastic=False, episodes=True)
def greedy(model, tokenizer, prompts, request: SampleRequest, options=None, generator=None) -> Sampled:
    """The most likely token at every step."""
    return _ancestral(model, tokenizer, prompts, request, True, generator)


@samplers.register("temperature", stochastic=True, episodes=True)
def temperature(model, tokenizer, prompts, request: SampleRequest, options=None, generator=None) -> Sampled:
    """Ancestral sampling at the caller's temperature (`eval.temperature`, `rl.temperature`)."""
    return _ancestral(model, tokenizer, prompts, request, False, generator)


# --- power and PPT ------------------------------------------------------------------------------------------------

def _chains(model, tokenizer, prompts, request: SampleRequest, ladder, generator, **kwargs) -> Sampled:
    device = next(model.parameters()).device
    ids, mask = encode_prompts(tokenizer, prompts, device)
    was_training = model.training
    model.eval()
    traces, spent, stats = run_chains(model, ids, mask, ladder, request.n, request.max_new_tokens, tokenizer.eos_token_id,
                                      tokenizer.pad_token_id, generator, StopStrings(tokenizer, request.stop), **kwargs)
    model.train(was_training)
    samples = samples_from_rows([t.tokens for t in traces], [_base_logp(t) for t in traces],
                                [t.ended for t in traces], tokenizer.pad_token_id, device)
    return Sampled(samples, decoded(tokenizer, samples, request.stop), request.n, dict(spent), stats)


def _base_logp(trace) -> Tensor:
    return trace.logit - trace.lse[:, 0]  # the engine's ladder is sorted and holds 1.0, the smallest power


@samplers.register("power", stochastic=True, options=PowerOptions)
def power(model, tokenizer, prompts, request: SampleRequest, options: PowerOptions, generator=None) -> Sampled:
    """Block-wise Metropolis-Hastings towards p^alpha (Karan & Du 2025, arXiv 2510.14901, Alg. 1)."""
    return _chains(model, tokenizer, prompts, request, (options.alpha,), generator, blocks=options.blocks,
                   mcmc_steps=options.mcmc_steps, full_tail=options.full_tail)


@samplers.register("ppt", stochastic=True, options=PPTOptions)
def ppt(model, tokenizer, prompts, request: SampleRequest, options: PPTOptions, generator=None) -> Sampled:
    """Parallel Power Tempering: M replicas on alpha_m = alpha^{(m-1)/(M-1)} with replica exchange (Parallel Power Tempering, 2026)."""
    return _chains(model, tokenizer, prompts, request, geometric_ladder(options.alpha, options.replicas), generator,
                   blocks=options.blocks, mcmc_steps=options.mcmc_steps, full_tail=options.full_tail, swap=options.swap,
                   swap_every=options.swap_every)

from posttrain.rollout import beam as _beam  # noqa: E402,F401  (registers beam and ttsd)
