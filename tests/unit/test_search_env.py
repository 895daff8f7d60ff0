"""The search environment (envs/search.py), its task (tasks/search.py) and the retrievers (envs/retrievers.py) on a
micro corpus: the world and its questions, the answer scores, episodes through the multi-turn rollout with the
observations masked from the loss, BM25's recall of the gold passages, and the stochastic retrieval policy."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from posttrain import resolve
from posttrain.envs.retrievers import RetrievalPolicy, build_retriever, plackett_luce_logp, retrievers
from posttrain.envs.search import RESULT_OPEN, SearchEpisode, build_corpus, exact_match, parse_answer, strip_observations, token_f1
from posttrain.rollout.sampling import decode_completions
from posttrain.models.tokenizer import train_char_tokenizer
from posttrain.tasks import build_task

PARAMS = Path(__file__).resolve().parents[2] / "params.yaml"
MICRO = ["task.name=search", "task.n_train=40", "task.n_heldout=20", "task.options.search.people=30", "task.options.search.companies=6",
         "task.options.search.cities=5"]


@pytest.fixture(scope="module")
def task():
    return build_task(resolve.load(PARAMS, MICRO).task)


def test_corpus_is_seeded_and_every_question_has_gold_passages_holding_its_answer():
    a, b = build_corpus(30, 6, 5, seed=0), build_corpus(30, 6, 5, seed=0)
    assert a == b and a != build_corpus(30, 6, 5, seed=1)
    assert len(a.passages) == 30 * 4 + 6 * 2 and len(a.questions) == 30 * 3
    for q in a.questions:
        assert q.answer in a.passages[q.gold[-1]].split()  # the last hop states the answer
        assert len(q.gold) == (2 if q.kind == "hq" else 1) == len(q.queries)
        if q.kind == "hq":  # the first hop names the company the second hop is about
            company = a.passages[q.gold[0]].split()[-1]
            assert a.passages[q.gold[1]].startswith(company + " is based")
    # near-duplicates: each person has a distractor naming a company that is not their employer
    p0 = [p for p in a.passages if p.startswith("p0 ")]
    assert len(p0) == 4 and len({p.split()[-1] for p in p0 if p.split()[1] in ("works", "visited")}) == 2


def test_splits_are_disjoint_and_references_pass_the_verifier(task):
    splits = task.splits(0)
    assert splits == task.splits(0) and [e.prompt for e in splits["train"]] != [e.prompt for e in task.splits(1)["train"]]
    assert not {e.prompt for e in splits["train"]} & {e.prompt for e in splits["heldout"]}
    for e in splits["train"] + splits["heldout"]:
        assert task.reference_verified(e) and set(e.prompt + e.completion) <= set(task.alphabet())
    with pytest.raises(Exception, match="exceeds"):
        build_task(resolve.load(PARAMS, MICRO + ["task.n_train=80", "task.n_heldout=20"]).task).splits(0)


def test_answer_scores_and_the_cost_per_call():
    assert parse_answer("<search>x</search><answer> t3 </answer>") == "t3" and parse_answer("<answer>t3") is None
    assert parse_answer(f"{RESULT_OPEN}<answer>c1</answer></result><answer>c2</answer>") == "c2"  # an observation is not an answer
    assert exact_match("The T3.", "t3") == 1.0 and exact_match(None, "t3") == 0.0
    assert token_f1("t3 t4", "t3") == pytest.approx(2 * 0.5 * 1.0 / 1.5) and token_f1("x", "t3") == 0.0
    cfg = resolve.load(PARAMS, MICRO + ["task.options.search.cost_per_call=0.1"]).task
    paid = build_task(cfg)
    e = paid.splits(0)["train"][0]
    calls = e.completion.count("<search>")
    assert paid.correctness_reward(strip_observations(e.completion), True, e) == pytest.approx(1.0 - 0.1 * calls)
    assert paid.correctness_reward("<answer>nope</answer>", True, e) == 0.0


def test_episode_answers_searches_with_passages_and_ends_at_the_answer(task):
    e = next(x for x in task.splits(0)["train"] if x.metadata["kind"] == "hq")
    env = task.episode(e.prompt)
    assert env.reset() == e.prompt
    observations = ""
    for ch in strip_observations(e.completion):
        step = env.step(ch)
        observations += step.observation
    assert step.done and step.reward == 1.0
    assert [c.query for c in env.calls] == list(task.question(e).queries)
    assert observations and all(block in e.completion for block in observations.split("</result>") if block)
    assert task.recall([env]) == 1.0  # the reference queries reach both gold passages through BM25
    # a closing tag alone is text; one call past max_calls ends the episode unanswered
    lone = task.episode(e.prompt)
    lone.reset()
    assert not any(lone.step(ch).observation for ch in "</search>")
    capped = SearchEpisode(e.prompt, task.corpus, task.retrieval, max_calls=1)
    capped.reset()
    assert [capped.step(ch) for ch in "<search>p0 works</search>"][-1].observation.startswith(RESULT_OPEN)
    assert [capped.step(ch) for ch in "<search>p1 works</search>"][-1].done


class Scripted(nn.Module):
    """A policy that writes a fixed action string per prompt (whatever the environment answered), then EOS: it
    reads its row, drops the prompt and the `<result>` blocks, and puts all mass on the next action character. It
    decodes like a causal LM with a KV cache: a call with a new cache object reads a prompt, a call with the same
    cache appends one token per row to what that cache has seen."""

    config = SimpleNamespace(model_type="scripted")

    def __init__(self, tokenizer, scripts: dict[str, str]):
        super().__init__()
        self.tokenizer, self.scripts = tokenizer, scripts
        self.anchor = nn.Parameter(torch.zeros(()))
        self.cache, self.seen = None, None

    def forward(self, input_ids, attention_mask, position_ids=None, cache=None, use_cache=False, logits_to_keep=1):
        self.seen = input_ids if cache is not self.cache else torch.cat([self.seen, input_ids], dim=1)
        self.cache = cache
        logits = torch.full((len(input_ids), 1, len(self.tokenizer)), -1e4)
        for r, row in enumerate(self.seen):
            text = self.tokenizer.decode(row[attention_mask[r] == 1], skip_special_tokens=True)
            prompt = next(p for p in self.scripts if text.startswith(p))
            done = strip_observations(text[len(prompt):])
            script = self.scripts[prompt]
            token = self.tokenizer.eos_token_id if len(done) >= len(script) else self.tokenizer.convert_tokens_to_ids(script[len(done)])
            logits[r, 0, token] = 0.0
        return SimpleNamespace(logits=logits)


def test_episodes_through_the_multi_turn_rollout_mask_the_observations(task):
    examples = task.splits(0)["train"][:3]
    tokenizer = train_char_tokenizer([task.alphabet()])
    policy = Scripted(tokenizer, {e.prompt: strip_observations(e.completion) for e in examples})
    prompts = tokenizer([e.prompt for e in examples], padding=True, return_tensors="pt", add_special_tokens=False)
    sample = task.sampler(tokenizer)
    samples = sample(policy, prompts.input_ids, prompts.attention_mask, group_size=2, max_new_tokens=400, eos_id=tokenizer.eos_token_id,
                     pad_id=tokenizer.pad_token_id)
    assert len(task.last_episodes) == 6 and all(ep.calls for ep in task.last_episodes)
    texts = decode_completions(tokenizer, samples)
    for row, text in enumerate(texts):
        example = examples[row // 2]
        full = tokenizer.decode(samples.completion_ids[row][samples.attention[row] == 1], skip_special_tokens=True)
        assert full == example.completion  # the environment answered as in the reference transcript
        assert text == strip_observations(example.completion) and RESULT_OPEN not in text  # rewards read actions only
        assert task.correctness_reward(text, True, example) == 1.0
        observed = (samples.completion_mask[row] == 0) & (samples.attention[row] == 1)
        assert observed.any() and (samples.logp[row][observed] == 0).all()
        assert tokenizer.decode(samples.completion_ids[row][observed]).startswith(RESULT_OPEN)


def test_bm25_reaches_the_gold_passages_of_the_reference_queries(task):
    assert {"bm25", "dual_encoder", "path"} <= set(retrievers.names())
    hits = [q.gold[h] in task.retriever.top(query, 2) for q in task.corpus.questions for h, query in enumerate(q.queries)]
    assert sum(hits) / len(hits) > 0.9
    scores = task.retriever.scores(["p3 works", "zz"])
    assert scores.shape == (2, len(task.corpus.passages)) and (scores[1] == 0).all()


def test_retrieval_policy_is_a_distribution_and_its_log_probs_match():
    passages = build_corpus(30, 6, 5, seed=0).passages
    encoder = build_retriever("dual_encoder", passages, dim=16)
    policy = RetrievalPolicy(encoder, k=3, candidates=8, tau=0.5, generator=torch.Generator().manual_seed(0))
    ids, probs = policy.distribution("p3 works")
    assert len(ids) == 8 and probs.sum().item() == pytest.approx(1.0, abs=1e-6) and (probs > 0).all()
    chosen, event = policy("p3 works")
    assert len(set(chosen)) == 3 and set(chosen) <= set(ids)
    again = policy.log_prob([event])
    assert again.requires_grad and again.item() == pytest.approx(event.logp, abs=1e-5)
    # Plackett-Luce by hand: p(a) * p(b | not a)
    logits = torch.tensor([1.0, 0.0, -1.0])
    p = torch.softmax(logits, 0)
    assert plackett_luce_logp(logits, torch.tensor([2, 0])).item() == pytest.approx(float(p[2].log() + (p[0] / (1 - p[2])).log()), abs=1e-6)
    greedy = RetrievalPolicy(encoder, k=2, candidates=8, tau=0.5, greedy=True)
    assert greedy("p3 works")[0] == encoder.top("p3 works", 2)
    with pytest.raises(Exception, match="top_k"):
        RetrievalPolicy(encoder, k=9, candidates=8, tau=0.5)


@pytest.mark.parametrize("override, message", [
    ("task.options.search.retriever=bm2", "no registered retriever 'bm2'"),
    ("task.options.search.top_k=30", "exceeds candidates"),
    ("task.options.search.retriever=path", "needs retriever_path"),
])
def test_bad_search_settings_are_one_line_errors(override, message):
    from posttrain.errors import UserError

    with pytest.raises(UserError, match=message):
        resolve.load(PARAMS, ["task.name=search", override])
