"""Beam search, and test-time self-distillation (TTSD) as beam search on a tilted score.

Test-time self-distillation (2026; the decoding-time counterpart of SDFT's implicit PMI reward): with two fixed
counterfactual contexts, c+ priming careful expert reasoning and c- priming
careless reasoning, the reward of an answer is the log-odds r(y) = log p(y|x,c+) - log p(y|x,c-). The KL-regularised
optimum is the Gibbs tilt pi*(y) = p(y|x) exp(r(y)/beta) / Z, a sequence-level reweighting that does not factorise
over tokens, so it is approximated by beam search on the additive prefix score

    score(y_<=t) = sum_{s<=t} [ log p(y_s|x,y_<s) + (1/beta) * (log p(y_s|x,c+,y_<s) - log p(y_s|x,c-,y_<s)) ]

Each context has its own rows in one KV cache (the rollout engine's decoder: models/decoders.py, `select` keeps the
surviving beams) and every beam of every prompt and context advances in one forward per step. A beam expands by the `top_k` most likely tokens of the base model; the best finished hypothesis by
score / length^length_penalty is the answer. With beta -> infinity (or c+ == c-) it is plain beam search.
A hypothesis whose text completes a stop string finishes there, as at EOS (the token that completes it included).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from pydantic import Field
from torch import Tensor

from posttrain.config import Section
from posttrain.models.chat import encode_prompts
from posttrain.models.decoders import decoder_for
from posttrain.models.precision import autocast
from posttrain.rollout.sampling import StopStrings
from posttrain.rollout.samplers import Sampled, SampleRequest, decoded, samplers, samples_from_rows, with_context


def tilted_score_increment(logp_base: Tensor, logp_pos: Tensor, logp_neg: Tensor, beta: float) -> Tensor:
    """The per-token increment of the TTSD prefix score (any shape; log-probs of the same tokens)."""
    return logp_base + (logp_pos - logp_neg) / beta


def gibbs_tilt(logp_base: Tensor, logp_pos: Tensor, logp_neg: Tensor, beta: float) -> Tensor:
    """pi*(y) over an enumerated set of whole sequences, from their sequence log-probs [S] under the three
    contexts: p(y|x) (p(y|x,c+) / p(y|x,c-))^(1/beta), normalised."""
    return torch.softmax(tilted_score_increment(logp_base, logp_pos, logp_neg, beta), dim=-1)


def local_tilt(step_base: Tensor, step_pos: Tensor, step_neg: Tensor, beta: float) -> Tensor:
    """The token-factorised ("local") reweighting of one step: softmax over the vocabulary of the per-token
    increment, from next-token log-distributions [..., V]."""
    return torch.softmax(tilted_score_increment(step_base, step_pos, step_neg, beta), dim=-1)


class BeamOptions(Section):
    width: int = Field(4, ge=1)  # beams kept per prompt
    length_penalty: float = Field(1.0, ge=0.0)  # finished hypotheses rank by score / length^length_penalty (0: raw sum)


class TTSDOptions(Section):
    width: int = Field(4, ge=1)  # beams kept per prompt
    top_k: int = Field(8, ge=1)  # tokens of the base model each beam expands by
    beta: float = Field(1.0, gt=0.0)  # 1/beta: the guidance strength of the log-odds reward
    length_penalty: float = Field(1.0, ge=0.0)
    positive: str = "expert, verified: "  # c+, written before the prompt's text
    negative: str = "careless: "  # c-


@torch.no_grad()
def beam_search(model, tokenizer, prompts: Sequence, max_new_tokens: int, width: int, top_k: int, length_penalty: float,
                contexts: Sequence[str] = (), beta: float = 1.0, stop: StopStrings | None = None,
                ) -> tuple[list[Tensor], list[Tensor], list[bool], list[float], dict[str, int]]:
    """Best hypothesis per prompt: (tokens, base log-probs, finished, score, forward tokens). With `contexts`
    (c+, c-) the score adds the (1/beta)-scaled log-odds of the token under them; `stop` ends a hypothesis at a
    stop string as EOS does."""
    stop = stop if stop else None
    device = next(model.parameters()).device
    names = ["plain", *(["positive", "negative"] if contexts else [])]
    c, n, b, eos = len(names), len(prompts), width, tokenizer.eos_token_id
    rows = [with_context(p, prefix) for p in prompts for prefix in ("", *contexts)]  # prompt-major, then context
    ids, mask = encode_prompts(tokenizer, rows, device)
    spent = {f"{name}_{kind}": 0 for name in names for kind in ("prompt", "generated")}
    for j, name in enumerate(names):
        spent[f"{name}_prompt"] = int(mask[j::c].sum())
    was_training = model.training
    model.eval()
    decoder = decoder_for(model)
    with autocast(model):
        logits = decoder.prefill(ids, mask, b, max_new_tokens)  # rows (prompt, context, beam)
    scores = torch.full((n, b), float("-inf"), device=device)
    scores[:, 0] = 0.0  # one live beam to start: the others would repeat it
    tokens = torch.zeros(n, b, 0, dtype=torch.long, device=device)
    base_logps = torch.zeros(n, b, 0, device=device)
    finished: list[list[tuple]] = [[] for _ in range(n)]  # (rank, tokens, logps, score, ended)
    k = min(top_k, logits.shape[-1])
    for t in range(max_new_tokens):
        logp = torch.log_softmax(logits, -1).view(n, c, b, -1)
        base = logp[:, 0]
        increment = tilted_score_increment(base, logp[:, 1], logp[:, 2], beta) if contexts else base
        top = base.topk(k, dim=-1).indices  # [n, b, k]
        candidates = scores[:, :, None] + increment.gather(-1, top)  # [n, b, k]
        flat = candidates.view(n, -1)
        order = flat.argsort(dim=-1, descending=True)
        keep_src = torch.zeros(n, b, dtype=torch.long, device=device)
        keep_tok = torch.full((n, b), eos, dtype=torch.long, device=device)
        keep_score = torch.full((n, b), float("-inf"), device=device)
        for i in range(n):
            kept = 0
            for j in order[i].tolist():
                score = float(flat[i, j])
                if score == float("-inf") or kept == b:
                    break
                src, tok = divmod(j, k)
                token = int(top[i, src, tok])
                new_tokens = torch.cat([tokens[i, src], top[i, src, tok : tok + 1]])
                new_logps = torch.cat([base_logps[i, src], base[i, src, token : token + 1]])
                ends = token == eos or (stop is not None and stop.holds([new_tokens.tolist()])[0])
                if ends or t == max_new_tokens - 1:
                    length = new_tokens.shape[0]
                    finished[i].append((score / length**length_penalty, new_tokens, new_logps, score, ends))
                    if ends:
                        continue
                keep_src[i, kept], keep_tok[i, kept], keep_score[i, kept] = src, token, score
                kept += 1
        if t == max_new_tokens - 1 or all(len(f) >= b for f in finished):
            break
        # rows (prompt, context, beam) <- (prompt, context, source beam)
        index = (torch.arange(n, device=device)[:, None, None] * c + torch.arange(c, device=device)[None, :, None]) * b
        index = (index + keep_src[:, None, :]).reshape(-1)
        decoder.select(index)
        tokens = torch.cat([tokens.gather(1, keep_src[:, :, None].expand(-1, -1, tokens.shape[2])), keep_tok[:, :, None]], dim=2)
        base_logps = torch.cat([base_logps.gather(1, keep_src[:, :, None].expand(-1, -1, base_logps.shape[2])),
                                base.gather(1, keep_src[:, :, None].expand(-1, -1, base.shape[-1])).gather(-1, keep_tok[:, :, None])], dim=2)
        scores = keep_score
        # a dead slot (score -inf) copies a live beam's rows and is fed EOS: it stays dead, so its rows never count
        live = (scores > float("-inf")).repeat_interleave(c, 0).reshape(n, c, b)  # [n, c, b]
        for j, name in enumerate(names):
            spent[f"{name}_generated"] += int(live[:, j].sum())
        feed = keep_tok[:, None, :].expand(n, c, b).reshape(-1)
        with autocast(model):
            logits = decoder.step(feed)
    model.train(was_training)
    best_tokens, best_logps, done, best_scores = [], [], [], []
    for i in range(n):
        rank, toks, lps, score, ended = max(finished[i], key=lambda f: f[0])
        best_tokens.append(toks)
        best_logps.append(lps)
        done.append(ended)
        best_scores.append(score)
    spent["prompt"] = sum(spent[f"{name}_prompt"] for name in names)
    spent["generated"] = sum(spent[f"{name}_generated"] for name in names)
    return best_tokens, best_logps, done, best_scores, spent


def _sampled(tokenizer, request: SampleRequest, found, device) -> Sampled:
    best_tokens, best_logps, done, scores, spent = found
    samples = samples_from_rows(best_tokens, best_logps, done, tokenizer.pad_token_id, device)
    return Sampled(samples, decoded(tokenizer, samples, request.stop), 1, spent, {"mean_score": sum(scores) / max(len(scores), 1)})


@samplers.register("beam", stochastic=False, options=BeamOptions)
def beam(model, tokenizer, prompts, request: SampleRequest, options: BeamOptions, generator=None) -> Sampled:
    """Beam search on the summed log-prob with length normalisation (Wu et al. 2016, arXiv 1609.08144, eq. 14)."""
    found = beam_search(model, tokenizer, prompts, request.max_new_tokens, options.width, options.width, options.length_penalty,
                        stop=StopStrings(tokenizer, request.stop))
    return _sampled(tokenizer, request, found, next(model.parameters()).device)


@samplers.register("ttsd", stochastic=False, options=TTSDOptions)
def ttsd(model, tokenizer, prompts, request: SampleRequest, options: TTSDOptions, generator=None) -> Sampled:
    """Beam search on base log-prob + (1/beta) log p(.|c+)/p(.|c-), three contexts with their own KV rows (test-time self-distillation, 2026)."""
    found = beam_search(model, tokenizer, prompts, request.max_new_tokens, options.width, options.top_k, options.length_penalty,
                        (options.positive, options.negative), options.beta, StopStrings(tokenizer, request.stop))
    return _sampled(tokenizer, request, found, next(model.parameters()).device)
