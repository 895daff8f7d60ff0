"""Power sampling and Parallel Power Tempering: Metropolis-Hastings towards p(y | x)^alpha.

power  Karan & Du, "Reasoning with Sampling: Your Base Model is Smarter Than You Think" (arXiv 2510.14901),
       Algorithm 1. Target pi_alpha(y) ∝ p(y|x)^alpha; proposal q = softmax(alpha * logits)
       (temperature 1/alpha) restarted from a uniform position idx of the current sequence. The sequence grows
       in blocks; after each block `mcmc_steps` moves of

           log A = alpha * [log p(y'_{idx:}) - log p(y_{idx:})] + [log q(y_{idx:}) - log q(y'_{idx:})]

       accept with min(1, e^{log A}). As in the paper's code, a proposal runs at most to the current length and,
       when it ends early (EOS), is compared with the current sequence truncated to its length (`full_tail:
       false`), and a chain stops once its sequence has ended.
ppt    Parallel Power Tempering (PPT, 2026): M replicas on the ladder alpha_m = alpha^{(m-1)/(M-1)} (alpha_1 = 1),
       each with the move above at its own alpha, batched into one forward per step; after every `swap_every`
       blocks neighbours (m, m+1) exchange sequences with

           log A_swap = (alpha_m - alpha_{m+1}) * (log p(y^{(m+1)}) - log p(y^{(m)}))

       over even-odd pairs alternately (DEO) or one random pair. Full-sequence scoring removes the truncation
       bias (`full_tail: true`): a proposal runs to EOS or the block end, the ratio sums each sequence's whole
       suffix, and the uniform choice of idx gets its Hastings factor len(y) / len(y'). The answer is replica M's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch
from pydantic import Field
from torch import Tensor

from posttrain.config import Section
from posttrain.rollout.engine import KVEngine, Request, Trace


# --- the acceptance rules (pure functions; the spec's invariants are tested on them) -------------------------

def mh_log_acceptance(alpha: float, new_logp: Tensor, new_logq: Tensor, cur_logp: Tensor, cur_logq: Tensor, full_tail: bool,
                      cur_choices: int | None = None, new_choices: int | None = None) -> float:
    """log A of replacing the current suffix (log p, log q per token from idx on) by a proposed one.

    full_tail False (the paper's rule): the current suffix is cut to the proposal's length. True: both suffixes
    count to their ends, and with `cur_choices` / `new_choices` (how many restart positions each sequence offers)
    the ratio of the uniform index choices log(cur_choices / new_choices) is added."""
    if not full_tail:
        cur_logp, cur_logq = cur_logp[: new_logp.shape[0]], cur_logq[: new_logq.shape[0]]
    log_a = alpha * float(new_logp.sum() - cur_logp.sum()) + float(cur_logq.sum() - new_logq.sum())
    if full_tail and cur_choices and new_choices:
        log_a += math.log(cur_choices) - math.log(new_choices)
    return log_a


def acceptance(log_a: float) -> float:
    """min(1, exp(log A)), in [0, 1]."""
    return 1.0 if log_a >= 0 else math.exp(log_a)


def swap_log_acceptance(alpha_m: float, alpha_next: float, logp_m: float, logp_next: float) -> float:
    """log A of exchanging the sequences of replicas m and m+1 (log p of the sequence each holds)."""
    return (alpha_m - alpha_next) * (logp_next - logp_m)


def geometric_ladder(alpha: float, replicas: int) -> tuple[float, ...]:
    """alpha_m = alpha^{(m-1)/(M-1)} for m = 1..M (one replica: alpha itself)."""
    if replicas == 1:
        return (alpha,)
    return tuple(alpha ** (m / (replicas - 1)) for m in range(replicas))


def swap_pairs(replicas: int, round_index: int, schedule: str, generator: torch.Generator | None) -> list[int]:
    """The lower replica m of each neighbour pair (m, m+1) proposed to swap in this round."""
    if replicas < 2:
        return []
    if schedule == "deo":
        return list(range(round_index % 2, replicas - 1, 2))
    return [int(torch.randint(replicas - 1, (1,), generator=generator))]


# --- the chains ----------------------------------------------------------------------------------------------

def _logp(trace: Trace, ladder: Sequence[float], start: int = 0) -> Tensor:
    return trace.logq(ladder.index(1.0), 1.0)[start:]


def tempered_chains(engine, prompt_ids: Tensor, prompt_mask: Tensor, *, n: int, ladder: Sequence[float], max_new_tokens: int,
                    blocks: int, mcmc_steps: int, full_tail: bool, swap: str = "deo", swap_every: int = 1,
                    generator: torch.Generator | None = None, stats: dict[str, float] | None = None) -> list[Trace]:
    """For each prompt row, `n` independent runs of M = len(ladder) replicas; returns the top replica's trace of
    each run (rows prompt-major). `engine.ladder` must hold 1.0 and every ladder power."""
    powers = tuple(engine.ladder)
    m_count = len(ladder)
    a_index = [powers.index(a) for a in ladder]
    chains = engine.start(prompt_ids, prompt_mask, n * m_count)  # runs r, replicas m: index r * M + m
    alpha_of = [ladder[i % m_count] for i in range(len(chains))]
    a_of = [a_index[i % m_count] for i in range(len(chains))]
    block = math.ceil(max_new_tokens / blocks)
    moves = accepted = swaps = swaps_accepted = 0
    done = [False] * (len(chains) // m_count)  # a run is done once its top replica's sequence has ended
    rounds = 0
    for b in range(blocks):
        end = min(max_new_tokens, (b + 1) * block)
        live = [i for i in range(len(chains)) if not done[i // m_count]]
        if not live:
            break
        grow = [i for i in live if not chains[i].ended and len(chains[i]) < end]
        for i, trace in zip(grow, engine.extend([Request(chains[i], len(chains[i]), end - len(chains[i]), alpha_of[i]) for i in grow])):
            chains[i] = trace
        for _ in range(mcmc_steps):
            movable = [i for i in live if len(chains[i]) > 0]
            starts = {i: int(torch.randint(len(chains[i]), (1,), generator=generator)) for i in movable}
            limit = {i: (end if full_tail else len(chains[i])) for i in movable}
            proposals = engine.extend([Request(chains[i], starts[i], limit[i] - starts[i], alpha_of[i]) for i in movable])
            for i, new in zip(movable, proposals):
                cur, idx, alpha = chains[i], starts[i], alpha_of[i]
                log_a = mh_log_acceptance(
                    alpha, _logp(new, powers, idx), new.logq(a_of[i], alpha)[idx:], _logp(cur, powers, idx),
                    cur.logq(a_of[i], alpha)[idx:], full_tail, len(cur), len(new),
                )
                moves += 1
                if float(torch.rand((), generator=generator)) < acceptance(log_a):
                    chains[i] = new
                    accepted += 1
        if (b + 1) % swap_every == 0 and m_count > 1:
            for run in range(len(done)):
                if done[run]:
                    continue
                for m in swap_pairs(m_count, rounds, swap, generator):
                    lo, hi = run * m_count + m, run * m_count + m + 1
                    log_a = swap_log_acceptance(ladder[m], ladder[m + 1], float(_logp(chains[lo], powers).sum()),
                                                float(_logp(chains[hi], powers).sum()))
                    swaps += 1
                    if float(torch.rand((), generator=generator)) < acceptance(log_a):
                        chains[lo], chains[hi] = chains[hi], chains[lo]
                        swaps_accepted += 1
            rounds += 1
        for run in range(len(done)):
            done[run] = done[run] or chains[run * m_count + m_count - 1].ended
    if stats is not None:
        stats.update(mh_moves=moves, mh_acceptance=accepted / max(moves, 1), swaps=swaps, swap_acceptance=swaps_accepted / max(swaps, 1))
    return [chains[run * m_count + m_count - 1] for run in range(len(done))]


class PowerOptions(Section):
    alpha: float = Field(4.0, ge=1.0)  # the power of p(y|x)^alpha; the proposal's temperature is 1/alpha
    blocks: int = Field(3, ge=1)  # the answer grows in this many blocks of ceil(max_new_tokens / blocks) tokens
    mcmc_steps: int = Field(2, ge=0)  # MH moves per block
    full_tail: bool = False  # false: the paper's truncated comparison; true: PPT's full-sequence scoring


class PPTOptions(Section):
    alpha: float = Field(4.0, ge=1.0)  # alpha_M, the top of the geometric ladder (alpha_1 = 1)
    replicas: int = Field(4, ge=1)  # M
    blocks: int = Field(3, ge=1)
    mcmc_steps: int = Field(1, ge=0)  # MH moves per block and replica
    swap: Literal["deo", "random"] = "deo"  # even-odd pairs alternately, or one random neighbour pair per round
    swap_every: int = Field(1, ge=1)  # blocks between swap rounds
    full_tail: bool = True  # true removes the truncation bias (the method's default)


def run_chains(model, prompt_ids: Tensor, prompt_mask: Tensor, ladder: Sequence[float], n: int, max_new_tokens: int, eos_id: int,
               pad_id: int, generator, stop=None, **kwargs) -> tuple[list[Trace], dict[str, int], dict[str, float]]:
    """`tempered_chains` on the KV engine of `model`: (traces, forward tokens, chain statistics). `stop` (a
    `StopStrings`) ends a sequence where its text holds a stop string, as EOS does."""
    engine = KVEngine(model, sorted({1.0, *ladder}), eos_id, pad_id, generator, stop)
    stats: dict[str, float] = {}
    traces = tempered_chains(engine, prompt_ids, prompt_mask, n=n, ladder=ladder, max_new_tokens=max_new_tokens,
                             generator=generator, stats=stats, **kwargs)
    return traces, engine.forward_tokens, stats
