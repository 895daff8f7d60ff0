"""The invariants of the inference-time samplers (spec §0.6 power sampling, §10 PPT, §6 TTSD): acceptance rules on
hand-made tensors, the chains on an enumerable toy model, and the samplers on a tiny random model."""

from __future__ import annotations

import itertools
import math
import random
from types import SimpleNamespace

import pytest
import torch

from posttrain.rollout.beam import BeamOptions, TTSDOptions, gibbs_tilt, local_tilt, tilted_score_increment
from posttrain.rollout.engine import KVEngine, Request, Trace
from posttrain.rollout.power import (
    PowerOptions, PPTOptions, acceptance, geometric_ladder, mh_log_acceptance, swap_log_acceptance, swap_pairs, tempered_chains,
)
from posttrain.rollout.samplers import SampleRequest, draw, samplers

EOS = 2


# --- acceptance rules -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("full_tail", [False, True])
def test_mh_acceptance_is_a_probability(full_tail):
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        n_new, n_cur = int(torch.randint(1, 6, (1,), generator=g)), int(torch.randint(1, 6, (1,), generator=g))
        lp_new, lq_new = -torch.rand(n_new, generator=g) * 5, -torch.rand(n_new, generator=g) * 5
        lp_cur, lq_cur = -torch.rand(n_cur, generator=g) * 5, -torch.rand(n_cur, generator=g) * 5
        a = acceptance(mh_log_acceptance(4.0, lp_new, lq_new, lp_cur, lq_cur, full_tail, n_cur + 2, n_new + 2))
        assert 0.0 <= a <= 1.0


def test_alpha_one_with_the_base_as_proposal_accepts_every_proposal():
    lp_new, lp_cur = torch.tensor([-0.3, -2.0]), torch.tensor([-1.1, -0.2, -0.7])
    assert mh_log_acceptance(1.0, lp_new, lp_new, lp_cur, lp_cur, full_tail=False) == pytest.approx(0.0, abs=1e-6)
    assert acceptance(mh_log_acceptance(1.0, lp_new, lp_new, lp_cur, lp_cur, full_tail=False)) == 1.0


def test_a_proposal_that_ends_early_still_pays_for_the_removed_tail():
    alpha = 2.0
    lp_new, lq_new = torch.tensor([-0.5]), torch.tensor([-0.2])  # the proposal: one token, then EOS
    lp_cur, lq_cur = torch.tensor([-0.5, -1.0, -3.0]), torch.tensor([-0.2, -0.4, -1.5])  # the current suffix runs on
    truncated = mh_log_acceptance(alpha, lp_new, lq_new, lp_cur, lq_cur, full_tail=False)
    full = mh_log_acceptance(alpha, lp_new, lq_new, lp_cur, lq_cur, full_tail=True)
    assert truncated == pytest.approx(0.0)  # the paper's comparison ignores the current tail beyond the proposal
    assert full == pytest.approx(alpha * (-0.5 - (-4.5)) + (-2.1 - (-0.2)))  # both whole suffixes
    assert full != pytest.approx(truncated)
    # with restart-position counts, the uniform index choice gets its Hastings factor
    assert mh_log_acceptance(alpha, lp_new, lq_new, lp_cur, lq_cur, True, 5, 3) == pytest.approx(full + math.log(5 / 3))


def test_swap_acceptance_is_one_when_the_hotter_replica_holds_the_likelier_sequence():
    # replica m (alpha 1, hotter) holds log p = -1, replica m+1 (alpha 4) holds log p = -3
    assert acceptance(swap_log_acceptance(1.0, 4.0, -1.0, -3.0)) == 1.0
    reverse = acceptance(swap_log_acceptance(1.0, 4.0, -3.0, -1.0))
    assert 0.0 < reverse < 1.0 and reverse == pytest.approx(math.exp(-6.0))


def test_the_swap_move_keeps_the_product_target_invariant_by_exact_enumeration():
    logp = torch.log(torch.tensor([0.6, 0.3, 0.1]))  # a three-sequence space
    alphas = (1.0, 2.5)
    target = {}
    for a, b in itertools.product(range(3), repeat=2):
        target[a, b] = math.exp(alphas[0] * logp[a] + alphas[1] * logp[b])
    z = sum(target.values())
    target = {s: v / z for s, v in target.items()}

    def kernel(s, t):  # the swap move's transition probability from state s to state t
        swapped = (s[1], s[0])
        a = acceptance(swap_log_acceptance(alphas[0], alphas[1], float(logp[s[0]]), float(logp[s[1]])))
        if s[0] == s[1]:
            return 1.0 if t == s else 0.0
        return a if t == swapped else (1 - a if t == s else 0.0)

    for s, t in itertools.product(target, repeat=2):
        assert target[s] * kernel(s, t) == pytest.approx(target[t] * kernel(t, s))  # detailed balance
    for t in target:
        assert sum(target[s] * kernel(s, t) for s in target) == pytest.approx(target[t])  # invariance


def test_geometric_ladder_and_swap_schedules():
    assert geometric_ladder(4.0, 1) == (4.0,)
    assert geometric_ladder(4.0, 3) == pytest.approx((1.0, 2.0, 4.0))
    assert swap_pairs(5, 0, "deo", None) == [0, 2] and swap_pairs(5, 1, "deo", None) == [1, 3]
    assert swap_pairs(1, 0, "deo", None) == []
    g = torch.Generator().manual_seed(0)
    assert {swap_pairs(4, r, "random", g)[0] for r in range(50)} == {0, 1, 2}


# --- the chains on an enumerable toy model ---------------------------------------------------------------------

class ToyEngine:
    """An autoregressive model over {0, 1, EOS} whose next-token logits are a fixed random function of the
    prefix; the engine interface of rollout/engine.py (`start`, `extend`, `ladder`, `forward_tokens`)."""

    def __init__(self, ladder, seed=0, scale=1.5):
        self.ladder, self.scale, self.seed = tuple(sorted({1.0, *ladder})), scale, seed
        self.table: dict[tuple, tuple] = {}
        self.rng = random.Random(seed + 1)
        self.forward_tokens = {"prompt": 0, "generated": 0}

    def logits(self, prefix: tuple) -> torch.Tensor:
        return self._entry(prefix)[0]

    def _entry(self, prefix: tuple) -> tuple:
        """(logits, logsumexp(a * logits) per ladder power, {alpha: cumulative probabilities})"""
        if prefix not in self.table:
            g = torch.Generator().manual_seed(hash((self.seed, prefix)) % (2**31))
            z = torch.randn(3, generator=g) * self.scale
            lse = torch.logsumexp(torch.tensor(self.ladder)[:, None] * z[None, :], -1)
            self.table[prefix] = (z, lse, z.tolist(), {})
        return self.table[prefix]

    def logp(self, seq) -> float:
        return sum(float(torch.log_softmax(self.logits(tuple(seq[:t])), -1)[tok]) for t, tok in enumerate(seq))

    def start(self, prompt_ids, prompt_mask, repeat):
        empty = torch.empty(0, dtype=torch.long)
        return [Trace(empty, empty.float(), torch.empty(0, len(self.ladder)), None) for _ in range(prompt_ids.shape[0] * repeat)]

    def extend(self, requests):
        out = []
        for r in requests:
            tokens = r.trace.tokens[: r.keep].tolist()
            logit, lse = [r.trace.logit[: r.keep]], [r.trace.lse[: r.keep]]
            for _ in range(r.max_new):
                z, row, values, cdfs = self._entry(tuple(tokens))
                if r.alpha not in cdfs:
                    cdfs[r.alpha] = torch.softmax(r.alpha * z, -1).cumsum(-1).tolist()
                u = self.rng.random()
                tok = next((i for i, c in enumerate(cdfs[r.alpha]) if u < c), 2)
                tokens.append(tok)
                logit.append(torch.tensor([values[tok]]))
                lse.append(row[None])
                if tok == EOS:
                    break
            out.append(Trace(torch.tensor(tokens), torch.cat(logit), torch.cat(lse), None, ended=tokens[-1] == EOS))
        return out


def sequences(length):
    """Every completion: ended by EOS within `length` tokens, or `length` tokens without EOS."""
    for n in range(1, length + 1):
        for body in itertools.product((0, 1), repeat=n - 1):
            yield (*body, EOS)
    yield from itertools.product((0, 1), repeat=length)


def chain_distribution(engine, alpha, chains, mcmc_steps, full_tail, length=2):
    prompt = torch.zeros(1, 2, dtype=torch.long)
    traces = tempered_chains(engine, prompt, torch.ones_like(prompt), n=chains, ladder=(alpha,), max_new_tokens=length, blocks=1,
                             mcmc_steps=mcmc_steps, full_tail=full_tail, generator=torch.Generator().manual_seed(2))
    counts: dict[tuple, int] = {}
    for t in traces:
        key = tuple(t.tokens.tolist())
        counts[key] = counts.get(key, 0) + 1
    return {key: c / chains for key, c in counts.items()}


def total_variation(p: dict, q: dict) -> float:
    return 0.5 * sum(abs(p.get(k, 0.0) - q.get(k, 0.0)) for k in {*p, *q})


def test_the_power_chain_converges_to_p_to_the_alpha_on_an_enumerable_toy():
    alpha, engine = 3.0, ToyEngine((3.0,), seed=3)
    weights = {s: math.exp(alpha * engine.logp(s)) for s in sequences(2)}
    z = sum(weights.values())
    target = {s: w / z for s, w in weights.items()}
    base = {s: math.exp(engine.logp(s)) for s in sequences(2)}
    assert sum(base.values()) == pytest.approx(1.0)  # the enumeration covers every completion
    start = chain_distribution(engine, alpha, 800, 0, True)  # the low-temperature proposal alone
    chain = chain_distribution(engine, alpha, 800, 8, True)
    assert total_variation(chain, target) < 0.04
    assert total_variation(start, target) > 0.15 > 3 * total_variation(chain, target)  # the MH moves did the work


def test_ppt_with_one_replica_is_single_chain_power_sampling(tiny_lm):
    model, tok = tiny_lm
    prompts = ["12+34=", "5+6="]
    request = SampleRequest(max_new_tokens=5, n=2)
    power = draw("power", model, tok, prompts, request, PowerOptions(alpha=3.0, blocks=2, mcmc_steps=3, full_tail=True),
                 torch.Generator().manual_seed(5))
    ppt = draw("ppt", model, tok, prompts, request, PPTOptions(alpha=3.0, replicas=1, blocks=2, mcmc_steps=3, swap="deo", swap_every=1,
                                                               full_tail=True), torch.Generator().manual_seed(5))
    assert ppt.texts == power.texts and ppt.forward_tokens == power.forward_tokens
    assert torch.equal(ppt.samples.completion_ids, power.samples.completion_ids)
    assert ppt.stats["mh_acceptance"] == power.stats["mh_acceptance"] and ppt.stats["swaps"] == 0


# --- the samplers on a tiny model --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_lm(cfg):
    from posttrain.models import build_tiny, train_char_tokenizer

    tok = train_char_tokenizer(["0123456789-=+*abcdefghijklmnopqrstuvwxyz,: "])
    torch.manual_seed(0)
    model = build_tiny(cfg.model.model_copy(update={"hidden_size": 32, "intermediate_size": 64, "layers": 2}), tok)
    with torch.no_grad():  # sharper than the initialisation, so sequences differ in likelihood
        model.lm_head.weight.mul_(2.0)
    return model.eval(), tok


def full_logp(model, tok, prompt: str, completion_ids: torch.Tensor) -> torch.Tensor:
    ids = torch.tensor(tok(prompt, add_special_tokens=False).input_ids + completion_ids.tolist())[None]
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
    p = ids.shape[1] - len(completion_ids)
    return logp[p - 1 : -1].gather(-1, completion_ids[:, None]).squeeze(-1)


def test_cached_proposals_score_tokens_as_a_full_forward_and_recompute_only_the_suffix(tiny_lm):
    model, tok = tiny_lm
    prompts = ["12+34=", "5+6="]  # different lengths: left padding in the batch
    from posttrain.models.chat import encode_prompts

    ids, mask = encode_prompts(tok, prompts, torch.device("cpu"))
    engine = KVEngine(model, (1.0, 3.0), tok.eos_token_id, tok.pad_token_id, torch.Generator().manual_seed(0))
    traces = engine.start(ids, mask, 1)
    assert engine.forward_tokens["prompt"] == int(mask.sum()) - 2  # every prompt token but the last, once
    traces = engine.extend([Request(t, 0, 6, 3.0) for t in traces])
    before = dict(engine.forward_tokens)
    keep = [min(3, len(t) - 1) for t in traces]
    proposals = engine.extend([Request(t, k, 6 - k, 3.0) for t, k in zip(traces, keep)])
    spent = engine.forward_tokens["generated"] + engine.forward_tokens["prompt"] - before["generated"] - before["prompt"]
    assert spent == sum(len(p) - k for p, k in zip(proposals, keep))  # only the resampled suffix ran through the model
    for prompt, trace in [*zip(prompts, traces), *zip(prompts, proposals)]:
        cached = trace.logit - trace.lse[:, 0]
        assert torch.allclose(cached, full_logp(model, tok, prompt, trace.tokens), atol=1e-4)
    for t, p, k in zip(traces, proposals, keep):
        assert torch.equal(p.tokens[:k], t.tokens[:k])


def test_power_with_alpha_one_accepts_every_move_and_reports_its_compute(tiny_lm):
    model, tok = tiny_lm
    out = draw("power", model, tok, ["12+34=", "5+6="], SampleRequest(max_new_tokens=6, n=2),
               PowerOptions(alpha=1.0, blocks=3, mcmc_steps=2, full_tail=False), torch.Generator().manual_seed(0))
    assert out.stats["mh_acceptance"] == 1.0 and out.stats["mh_moves"] > 0
    sharp = draw("power", model, tok, ["12+34=", "5+6="], SampleRequest(max_new_tokens=6, n=2),
                 PowerOptions(alpha=4.0, blocks=3, mcmc_steps=2, full_tail=False), torch.Generator().manual_seed(0))
    assert 0.0 < sharp.stats["mh_acceptance"] < 1.0  # a real signal: proposals of different likelihood
    greedy = draw("greedy", model, tok, ["12+34=", "5+6="], SampleRequest(max_new_tokens=6))
    assert sharp.total_forward_tokens > greedy.total_forward_tokens * 2  # MH moves cost compute, and it is counted


def test_width_one_beam_search_is_greedy_decoding(tiny_lm):
    model, tok = tiny_lm
    prompts = ["12+34=", "5+6=", "99+1="]
    request = SampleRequest(max_new_tokens=6)
    assert draw("beam", model, tok, prompts, request, BeamOptions(width=1, length_penalty=0.0)).texts == \
        draw("greedy", model, tok, prompts, request).texts


def test_ttsd_with_equal_contexts_is_plain_beam_search(tiny_lm):
    model, tok = tiny_lm
    prompts = ["12+34=", "5+6=", "99+1="]
    request = SampleRequest(max_new_tokens=6)
    beam = draw("beam", model, tok, prompts, request, BeamOptions(width=3, length_penalty=1.0))
    same = draw("ttsd", model, tok, prompts, request, TTSDOptions(width=3, top_k=3, beta=1.0, length_penalty=1.0, positive="ab: ",
                                                                  negative="ab: "))
    assert same.texts == beam.texts and same.stats["mean_score"] == pytest.approx(beam.stats["mean_score"])
    differ = draw("ttsd", model, tok, prompts, request, TTSDOptions(width=3, top_k=3, beta=0.2, length_penalty=1.0, positive="expert: ",
                                                                    negative="careless: "))
    assert differ.stats["mean_score"] != pytest.approx(beam.stats["mean_score"])  # the log-odds move the score
    for context in ("plain", "positive", "negative"):  # each context has its own rows, counted
        assert differ.forward_tokens[f"{context}_prompt"] > 0 and differ.forward_tokens[f"{context}_generated"] > 0
    assert differ.forward_tokens["positive_prompt"] > differ.forward_tokens["plain_prompt"]


def test_the_tilted_distribution_is_not_token_factorisable():
    # two steps over a two-token vocabulary; next-token log-probs per context: step 1, then step 2 given token 1
    # after token 0 the contexts disagree strongly (c+ likes 0, c- likes 1); after token 1 they agree
    half = torch.tensor([0.5, 0.5]).log()
    tables = {
        "base": (half, torch.tensor([[0.5, 0.5], [0.5, 0.5]]).log()),
        "pos": (half, torch.tensor([[0.9, 0.1], [0.5, 0.5]]).log()),
        "neg": (half, torch.tensor([[0.1, 0.9], [0.5, 0.5]]).log()),
    }
    beta = 1.0
    seqs = list(itertools.product(range(2), repeat=2))

    def seq_logp(c, s):
        first, second = tables[c]
        return float(first[s[0]] + second[s[0], s[1]])

    pi = gibbs_tilt(*(torch.tensor([seq_logp(c, s) for s in seqs]) for c in ("base", "pos", "neg")), beta)
    assert float(pi.sum()) == pytest.approx(1.0)
    local_first = local_tilt(tables["base"][0], tables["pos"][0], tables["neg"][0], beta)
    local_second = local_tilt(tables["base"][1], tables["pos"][1], tables["neg"][1], beta)
    local = torch.tensor([float(local_first[a] * local_second[a, b]) for a, b in seqs])
    # the tilt moves mass to the first token whose continuations it favours (4.56 / 5.56 by hand); the local
    # reweighting cannot see ahead and keeps the first step at 1/2
    assert float(pi[0] + pi[1]) == pytest.approx((0.5 * 9 + 0.5 / 9) / (0.5 * 9 + 0.5 / 9 + 1), abs=1e-5)
    assert float(local[0] + local[1]) == pytest.approx(0.5)
    assert float((pi - local).abs().max()) > 0.1
    # the prefix score is additive, and a huge beta recovers the base model
    inc = tilted_score_increment(tables["base"][0], tables["pos"][0], tables["neg"][0], beta)
    second = tilted_score_increment(tables["base"][1], tables["pos"][1], tables["neg"][1], beta)
    assert float(inc[1] + second[1, 0]) == pytest.approx(seq_logp("base", (1, 0)) + (seq_logp("pos", (1, 0)) - seq_logp("neg", (1, 0))) / beta)
    base = torch.tensor([math.exp(seq_logp("base", s)) for s in seqs])
    assert torch.allclose(gibbs_tilt(base.log(), torch.zeros(4), torch.ones(4), 1e9), base, atol=1e-6)


def test_every_sampler_is_registered_with_its_options_and_kind():
    assert set(samplers.names()) >= {"greedy", "temperature", "beam", "power", "ppt", "ttsd"}
    stochastic = {e.name for e in samplers if e.meta["stochastic"]}
    assert stochastic == {"temperature", "power", "ppt"}
    assert samplers.entry("ppt").meta["options"] is PPTOptions


def test_eval_reports_the_chosen_sampler_next_to_greedy_and_sampled(tiny_lm, cfg):
    from posttrain import resolve
    from posttrain.eval.harness import evaluate
    from posttrain.tasks import build_task

    model, tok = tiny_lm
    task = build_task(cfg.task)
    held = task.splits(0)["heldout"][:4]
    eval_cfg = resolve.updated(cfg.eval, "eval", sampler="ppt", n_prompts=4, batch_size=4, samples_per_prompt=2, n_table=1,
                               options={"ppt": {"mcmc_steps": 1, "replicas": 2}})
    metrics, rows = evaluate(model, tok, task, held, eval_cfg, seed=0)
    assert {"greedy_accuracy", "sampled_accuracy", "pass_at_2", "sampler_accuracy", "sampler_pass_at_2", "sampler_swap_acceptance"} <= set(metrics)
    assert metrics["sampler_forward_tokens_per_answer"] == pytest.approx(
        metrics["sampler_forward_tokens_prompt_per_answer"] + metrics["sampler_forward_tokens_generated_per_answer"])
    assert metrics["sampler_forward_tokens_per_answer"] > 2 * metrics["greedy_forward_tokens_per_answer"] > 0
    assert len(rows) == 1


def test_quality_tags_mark_correct_and_planted_error_solutions(cfg):
    import random

    from posttrain import resolve
    from posttrain.tasks import build_task
    from posttrain.tasks.arithmetic import planted_error

    task_cfg = resolve.updated(cfg.task, "task", n_train=400, n_heldout=50,
                               options={"arithmetic": {"quality_tags": True, "careless_fraction": 0.3, "tagged_fraction": 0.5}})
    task = build_task(task_cfg)
    splits = task.splits(0)
    expert, careless = task.options.expert_tag, task.options.careless_tag
    tagged = [e for e in splits["train"] if e.prompt.startswith((expert, careless))]
    wrong = [e for e in splits["train"] if e.completion != e.answer]
    assert 0.35 < len(tagged) / 400 < 0.65 and 0.2 < len(wrong) / 400 < 0.4
    assert all(e.completion != e.answer for e in tagged if e.prompt.startswith(careless))
    assert all(e.completion == e.answer for e in tagged if e.prompt.startswith(expert))
    assert all(task.parse(e.completion) is not None for e in wrong)  # a planted error is still a well-formed answer
    assert not any(e.prompt.startswith((expert, careless)) or e.completion != e.answer for e in splits["heldout"])
    assert set(expert + careless) <= set(task.alphabet())
    rng = random.Random(0)
    errors = [(a, planted_error(a, rng)) for a in ["7", "10", "158", "99", "-12"] * 20]
    assert all(e != a and len(e) == len(a) and task.parse(e) is not None for a, e in errors)  # never a leading zero
    plain = build_task(cfg.task)  # the default: no tags, every solution correct
    assert all(e.completion == e.answer for e in plain.splits(0)["train"][:200])


def test_chunked_draws_add_their_counts_and_weight_their_rates(monkeypatch):
    from posttrain.rollout.sampling import Samples
    from posttrain.registry import Entry
    from posttrain.rollout.samplers import Sampled

    def fake(model, tokenizer, prompts, request, options, generator):  # 2 moves per prompt, all accepted for the first
        n = len(prompts)
        samples = Samples(torch.ones(n, 1, dtype=torch.long), torch.ones(n, 1), torch.zeros(n, 1), torch.ones(n, dtype=torch.bool))
        rate = 1.0 if prompts[0] == "a" else 0.0
        return Sampled(samples, list(prompts), 1, {"prompt": n, "generated": 2 * n},
                       {"mh_moves": 2.0 * n, "mh_acceptance": rate, "mean_score": 1.0 if rate else 3.0})

    monkeypatch.setitem(samplers._entries, "fake", Entry("fake", fake, {"stochastic": True}))
    out = draw("fake", None, SimpleNamespace(pad_token_id=0), ["a", "b", "c"], SampleRequest(max_new_tokens=1, chunk=1))
    assert out.texts == ["a", "b", "c"] and out.forward_tokens == {"prompt": 3, "generated": 6}
    assert out.stats["mh_moves"] == 6.0 and out.stats["mh_acceptance"] == pytest.approx(1 / 3)
    assert out.stats["mean_score"] == pytest.approx(7 / 3)


# --- stop strings end every sampler's sequences (forward tokens are not spent past them) -------------------------

STOP = ("1", "5", "a", "e", " ", "==", "cc")  # what the tiny random model writes often (greedily it repeats one character)


def with_and_without_stops(tiny_lm, name, options):
    """(tokenizer, answers without stop strings, answers with them) of sampler `name`, the same random numbers."""
    from dataclasses import replace

    model, tok = tiny_lm
    prompts, request = ["12+34=", "5+6=", "abc", "7*8="], SampleRequest(max_new_tokens=10, n=2)
    free = draw(name, model, tok, prompts, request, options, torch.Generator().manual_seed(3))
    return tok, free, draw(name, model, tok, prompts, replace(request, stop=STOP), options, torch.Generator().manual_seed(3))


@pytest.mark.parametrize("name, options", [
    ("greedy", None),
    ("power", PowerOptions(alpha=1.0, blocks=1, mcmc_steps=0, full_tail=False)),  # ancestral: the same draws with or without stops
    ("ppt", PPTOptions(alpha=1.0, replicas=1, blocks=1, mcmc_steps=0, swap="deo", swap_every=1, full_tail=True)),
    ("beam", BeamOptions(width=1, length_penalty=0.0)),
    ("ttsd", TTSDOptions(width=1, top_k=4, beta=0.5, length_penalty=0.0, positive="expert: ", negative="careless: ")),
])
def test_a_stop_string_ends_a_sequence_where_the_cut_text_ends(tiny_lm, name, options):
    from posttrain.rollout.sampling import StopStrings

    tok, free, stopped = with_and_without_stops(tiny_lm, name, options)
    cut = [StopStrings(tok, STOP).cut(t) for t in free.texts]
    assert cut != free.texts, "some answer must hold a stop string for this test to mean anything"
    assert stopped.texts == cut
    assert stopped.forward_tokens["generated"] < free.forward_tokens["generated"]
    assert stopped.samples.completion_mask.sum() < free.samples.completion_mask.sum()
    held = [any(s in t for s in STOP) for t in tok.batch_decode(stopped.samples.completion_ids, skip_special_tokens=True)]
    assert torch.equal(stopped.samples.finished[torch.tensor(held)], torch.ones(sum(held), dtype=torch.bool))  # ended, as at EOS


@pytest.mark.parametrize("name, options", [
    ("power", PowerOptions(alpha=4.0, blocks=2, mcmc_steps=2, full_tail=False)),
    ("ppt", PPTOptions(alpha=4.0, replicas=3, blocks=2, mcmc_steps=1, swap="deo", swap_every=1, full_tail=True)),
    ("ttsd", TTSDOptions(width=3, top_k=4, beta=0.5, length_penalty=1.0, positive="expert: ", negative="careless: ")),
])
def test_mh_moves_replicas_and_beams_stop_at_the_token_that_completes_a_stop_string(tiny_lm, name, options):
    tok, free, stopped = with_and_without_stops(tiny_lm, name, options)
    assert stopped.total_forward_tokens <= free.total_forward_tokens
    if name != "ttsd":  # a beam that stops is replaced by the next candidate (as at EOS), so the search may run as long
        assert stopped.total_forward_tokens < free.total_forward_tokens
    hits = 0
    for ids, mask in zip(stopped.samples.completion_ids, stopped.samples.completion_mask):
        tokens = ids[mask.bool()].tolist()
        before = tok.decode(tokens[:-1], skip_special_tokens=True)
        assert not any(s in before for s in STOP)  # nothing was generated past a stop string
        hits += any(s in tok.decode(tokens, skip_special_tokens=True) for s in STOP)
    assert hits > 0


# --- best-of-N ----------------------------------------------------------------------------------------------------

def test_best_of_n_picks_by_verifier_vote_and_likelihood_by_hand():
    from posttrain.eval.best_of_n import best_of_n, best_of_n_metrics
    from posttrain.rollout.sampling import Samples
    from posttrain.rollout.samplers import Sampled
    from posttrain.tasks import Example

    task = SimpleNamespace(parse=lambda t: t if t.isdigit() else None,
                           correctness_reward=lambda t, finished, e: float(t == e.answer))
    examples = [Example("a", "7", "7"), Example("b", "9", "9")]
    texts = ["3", "7", "3", "x", "9", "x"]  # prompt a: 7 is right, 3 the majority; b: one parsable answer, right
    logp = torch.tensor([[-1.0, -1.0], [-0.1, -3.0], [-2.0, 0.0], [-0.2, -0.2], [-5.0, 0.0], [-0.1, 0.0]])
    mask = torch.tensor([[1, 1], [1, 1], [1, 1], [1, 1], [1, 0], [1, 1]])  # mean log-probs -1, -1.55, -1 | -0.2, -5, -0.05
    samples = Samples(torch.zeros(6, 2, dtype=torch.long), mask, logp * mask, torch.ones(6, dtype=torch.bool))
    sampled = Sampled(samples, texts, 3, {"prompt": 6, "generated": 12})
    picks = best_of_n(sampled, task, examples, ("oracle", "vote", "likelihood"))
    assert picks == {"oracle": [1, 4], "vote": [0, 4], "likelihood": [0, 5]}
    m = best_of_n_metrics("bon", sampled, task, examples, ("oracle", "vote", "likelihood"))
    assert (m["bon_oracle_accuracy"], m["bon_vote_accuracy"], m["bon_likelihood_accuracy"]) == (1.0, 0.5, 0.0)
    assert m["bon_n"] == 3 and m["bon_forward_tokens_per_prompt"] == 9.0


def test_eval_reports_best_of_n_from_the_configured_sampler(tiny_lm, cfg, params_path):
    from posttrain import resolve
    from posttrain.errors import UserError
    from posttrain.eval.harness import evaluate
    from posttrain.tasks import build_task

    model, tok = tiny_lm
    task = build_task(cfg.task)
    held = task.splits(0)["heldout"][:3]
    from posttrain.config import BestOfNConfig

    eval_cfg = resolve.updated(cfg.eval, "eval", sampler="power", n_prompts=3, batch_size=3, n_table=0,
                               best_of_n=BestOfNConfig(n=3, picks=("oracle", "vote")), options={"power": {"mcmc_steps": 1, "blocks": 2}})
    metrics, _ = evaluate(model, tok, task, held, eval_cfg, seed=0)
    assert metrics["bon_n"] == 3 and {"bon_oracle_accuracy", "bon_vote_accuracy"} <= set(metrics) and "bon_likelihood_accuracy" not in metrics
    assert metrics["bon_oracle_accuracy"] >= metrics["bon_vote_accuracy"]  # the verifier's pick is an upper bound
    assert metrics["bon_forward_tokens_per_prompt"] > 2 * metrics["sampler_forward_tokens_per_answer"]  # N power draws, counted
    with pytest.raises(UserError, match="eval.best_of_n.n: greedy draws one answer per prompt"):
        resolve.load(params_path, ["eval.best_of_n.n=4", "eval.sampler=greedy"])
