"""A batched, KV-cached continuation engine for the Markov-chain samplers (power sampling, PPT).

A chain's state is its completion `y` and the keys/values of every token fed so far (the prompt and `y`
except its last token, which has not been fed). A Metropolis-Hastings proposal keeps `y[:keep]` and resamples
the rest: its prefix keys/values are a crop of the chain's own (nothing before `keep` is recomputed), the one
token before the cut is fed again to get the distribution at the cut, and only the new suffix runs through
the model. The proposals of many chains (prompts, samples, replicas) run as one batch: prefixes of different
lengths are right-aligned in one cache (left padding masked out), one forward per step for every row. The cache is
the rollout engine's decoder (models/decoders.py): `resume` continues from the stacked prefixes, `row_cache` hands
each chain its own columns back.

Per produced token the engine records the chosen token's raw logit and `logsumexp(a * logits)` for every
power `a` of a ladder, so the log-prob of the token under the base model (a = 1) and under any proposal
softmax(a * logits) (temperature 1/a) can be read back after a replica exchange without another forward.
`forward_tokens` counts the tokens run through the model (padding excluded). With `stop` (a `StopStrings`) a
proposal also ends, like at EOS, on the token after which the completion's text holds a stop string: the trace
is `ended` and nothing past it is generated or paid for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import PreTrainedModel

from posttrain.models.decoders import decoder_for
from posttrain.models.precision import autocast
from posttrain.rollout.decode import invert_cdf
from posttrain.rollout.sampling import StopStrings


@dataclass
class Trace:
    """What a chain holds: completion tokens [L] with, per token, the raw logit of the chosen token [L] and
    `logsumexp(a * logits)` for each ladder power a [L, A]; plus the cached prefix (opaque to the chain code)."""

    tokens: Tensor
    logit: Tensor
    lse: Tensor
    state: object  # the engine's cache of this sequence
    ended: bool = False

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def logq(self, a_index: int, alpha: float) -> Tensor:
        """Per-token log-probs under softmax(alpha * logits), alpha = ladder[a_index] (alpha 1: the base model)."""
        return alpha * self.logit - self.lse[:, a_index]


@dataclass(frozen=True)
class Request:
    trace: Trace  # the chain's current sequence
    keep: int  # tokens of trace.tokens kept
    max_new: int  # produce at most this many tokens after them (fewer when EOS comes first)
    alpha: float  # proposal softmax(alpha * logits)


@dataclass
class _Cached:
    keys: list[Tensor]  # per layer [Hkv, S, D]
    values: list[Tensor]
    mask: Tensor  # [S] 1 on real tokens
    stream: Tensor  # [S + 1] every token of prompt + completion (the last one is not fed yet)


class KVEngine:
    """Continuations of a causal LM (the fast Llama-family decoder, else `model.forward` with a KV cache), batched
    across requests."""

    def __init__(self, model: PreTrainedModel, ladder: Sequence[float], eos_id: int, pad_id: int, generator: torch.Generator | None,
                 stop: StopStrings | None = None):
        self.model, self.ladder, self.eos_id, self.pad_id, self.generator = model, tuple(ladder), eos_id, pad_id, generator
        self.stop = stop if stop else None
        self.device = next(model.parameters()).device
        self.forward_tokens = {"prompt": 0, "generated": 0}
        self.decoder = decoder_for(model)  # one for every call: the decode loop's weights are prepared once (models/decoders.py)

    @torch.no_grad()
    def start(self, prompt_ids: Tensor, prompt_mask: Tensor, repeat: int) -> list[Trace]:
        """Empty traces, `repeat` per prompt row (rows prompt-major); each prompt is encoded once, all but its last
        token (fed with the first proposal)."""
        head, head_mask = prompt_ids[:, :-1], prompt_mask[:, :-1]
        decoder = self.decoder
        if head.shape[1] > 0:
            with autocast(self.model):
                decoder.prefill(head, head_mask, 1, 0)
        self.forward_tokens["prompt"] += int(head_mask.sum())
        traces = []
        empty = torch.empty(0, dtype=torch.long, device=self.device)
        for row in range(prompt_ids.shape[0]):
            keys, values = decoder.row_cache(row, 0, head.shape[1]) if head.shape[1] > 0 else ([], [])
            cached = _Cached(keys, values, head_mask[row], prompt_ids[row])
            for _ in range(repeat):
                traces.append(Trace(empty, empty.float(), torch.empty(0, len(self.ladder), device=self.device), cached))
        return traces

    @torch.no_grad()
    def extend(self, requests: Sequence[Request]) -> list[Trace]:
        """One proposal per request, all in one batch: trace.tokens[:keep] + up to max_new sampled tokens."""
        if not requests:
            return []
        prefixes = [self._prefix(r) for r in requests]
        n = len(requests)
        width = max(p.mask.shape[0] for p in prefixes)
        layers = len(prefixes[0].keys)  # 0: a one-token prompt and nothing kept, no cache yet
        keys = [torch.stack([_right(p.keys[i], width) for p in prefixes]) for i in range(layers)]
        values = [torch.stack([_right(p.values[i], width) for p in prefixes]) for i in range(layers)]
        mask = torch.stack([_right(p.mask, width) for p in prefixes])  # [n, width]
        decoder = self.decoder
        with autocast(self.model):  # as its steps run: the loop's weights are prepared for it
            decoder.resume(keys, values, mask, max(r.max_new for r in requests))
        alphas = torch.tensor([r.alpha for r in requests], device=self.device)[:, None]
        ladder = torch.tensor(self.ladder, device=self.device)
        token = torch.stack([p.stream[-1] for p in prefixes])
        max_new = torch.tensor([r.max_new for r in requests], device=self.device)
        keeps = torch.tensor([r.keep for r in requests], device=self.device)
        produced = torch.zeros(n, dtype=torch.long, device=self.device)
        active = max_new > 0
        stopped = torch.zeros(n, dtype=torch.bool, device=self.device)
        # each row's completion so far (kept prefix + new tokens), for the stop test: only its last tokens are read
        tails = [r.trace.tokens[: r.keep].tolist()[-self.stop.window :] for r in requests] if self.stop else []
        tokens, logits_kept, lses, fed = [], [], [], []
        while bool(active.any()):
            fed.append(active)
            with autocast(self.model):
                logits = decoder.step(token)  # a row that is done feeds padding: nothing of it after its end is kept
            if not fed[1:]:  # the first fed token of a request keeping nothing is the prompt's last
                from_prompt = int((active & (keeps == 0)).sum())
                self.forward_tokens["prompt"] += from_prompt
                self.forward_tokens["generated"] += int(active.sum()) - from_prompt
            else:
                self.forward_tokens["generated"] += int(active.sum())
            scaled = alphas * logits
            token = invert_cdf(torch.softmax(scaled, -1), self.generator)[0]
            tokens.append(token)
            logits_kept.append(logits.gather(-1, token[:, None]).squeeze(-1))
            lses.append(torch.logsumexp(ladder[None, :, None] * logits[:, None, :], dim=-1))  # [n, A]
            produced = produced + active.long()
            if self.stop:
                rows = active.nonzero().flatten().tolist()
                for i in rows:
                    tails[i] = [*tails[i], int(token[i])][-self.stop.window :]
                hits = self.stop.holds([tails[i] for i in rows])
                stopped[[i for i, hit in zip(rows, hits) if hit]] = True
            active = active & (token != self.eos_id) & ~stopped & (produced < max_new)
            token = torch.where(active, token, torch.full_like(token, self.pad_id))
        tokens_t, logit_t, lse_t = torch.stack(tokens, 1), torch.stack(logits_kept, 1), torch.stack(lses, 1)
        fed_t = torch.stack(fed, 1)  # [n, steps] which rows were fed at each step
        out_traces = []
        for i, (r, p) in enumerate(zip(requests, prefixes)):
            k = int(produced[i])
            new_tokens = tokens_t[i, :k]
            size = p.mask.shape[0]
            fed_i = int(fed_t[i].sum())  # = k: the pending token and the produced tokens but the last
            # this row's prefix and what it fed (its later columns are padding)
            row_keys, row_values = decoder.row_cache(i, width - size, width + fed_i)
            cached = _Cached(
                row_keys, row_values,
                torch.cat([p.mask, torch.ones(fed_i, dtype=p.mask.dtype, device=self.device)]),
                torch.cat([p.stream, new_tokens]),
            )
            old = r.trace
            out_traces.append(Trace(
                torch.cat([old.tokens[: r.keep], new_tokens]), torch.cat([old.logit[: r.keep], logit_t[i, :k]]),
                torch.cat([old.lse[: r.keep], lse_t[i, :k]]), cached, ended=bool(k > 0 and (new_tokens[-1] == self.eos_id or stopped[i])),
            ))
        return out_traces

    def _prefix(self, r: Request) -> _Cached:
        """The cache of prompt + trace.tokens[:keep] minus its last token, which becomes the pending one."""
        c: _Cached = r.trace.state
        prompt_tail = c.stream.shape[0] - len(r.trace)  # stream = prompt + completion
        size = prompt_tail - 1 + r.keep  # tokens whose keys/values are kept
        return _Cached([k[:, :size] for k in c.keys], [v[:, :size] for v in c.values], c.mask[:size], c.stream[: size + 1])


def _right(t: Tensor, width: int) -> Tensor:
    """`t` [..., S, (D)] right-aligned in `width` positions along its sequence axis, zeros before."""
    seq_axis = 0 if t.dim() == 1 else 1
    pad = width - t.shape[seq_axis]
    if pad == 0:
        return t
    shape = list(t.shape)
    shape[seq_axis] = pad
    return torch.cat([t.new_zeros(shape), t], dim=seq_axis)
