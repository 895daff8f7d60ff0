"""The search environment (envs/search.py) as a task: a prompt is a multi-hop question over the seeded corpus, the
reference completion the reference queries with the retriever's answers and the gold answer, and the verifier
exact match or token F1 of the answer, minus `cost_per_call` per search call. Its `sampler` runs the episodes
(observations masked from the loss) in place of single-turn sampling, with the retrieval policy of
envs/retrievers.py; the episodes of the latest rollout stay readable (`last_episodes`) for a retriever learner.

Splits: questions are drawn from every kind (who employs, where lives, where is the employer based) and split
disjointly by question. Settings: task.options.search (defaults on its options model).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from functools import cached_property
from typing import Annotated, Literal

import torch
from pydantic import Field, model_validator

from posttrain.config import Registered, Section
from posttrain.envs.retrievers import RetrievalPolicy, Retriever, build_retriever, retrievers
from posttrain.envs.rollout import multi_turn_sample
from posttrain.envs.search import (
    ALPHABET, Corpus, Question, SearchEpisode, build_corpus, exact_match, parse_answer, question_of, reference_transcript, search_queries,
    token_f1,
)
from posttrain.errors import UserError
from posttrain.tasks import tasks
from posttrain.tasks.base import Example, Task


class SearchOptions(Section):
    people: int = Field(600, ge=2)  # the seeded world: people p0.., each works at a company and lives in a city
    companies: int = Field(40, ge=2)  # companies c0.., each based in a city
    cities: int = Field(30, ge=2)  # cities t0..; 4 passages a person + 2 a company (gold facts and near-duplicate distractors)
    corpus_seed: int = 0  # the world (one corpus for every pipeline seed)
    kinds: tuple[Literal["employer", "home", "hq"], ...] = ("employer", "home", "hq")  # the question kinds drawn
    retriever: Annotated[str, Registered("retrievers")] = "bm25"  # a registered retriever (envs/retrievers.py): bm25 | dual_encoder | path
    retriever_path: str | None = None  # retriever `path`: the checkpoint directory
    top_k: int = Field(2, ge=1)  # passages per search call
    candidates: int = Field(20, ge=1)  # N: the stochastic retrieval policy's candidate set (top-N by score)
    tau: float = Field(1.0, gt=0)  # softmax(score / tau) over the candidates
    stochastic: bool = False  # false: the top k every call (greedy retrieval)
    max_calls: int = Field(4, ge=1)  # search calls per episode; one more ends it unanswered
    reward: Literal["em", "f1"] = "em"  # em (exact match) | f1 (SQuAD token F1) of the <answer>
    cost_per_call: float = Field(0.0, ge=0)  # subtracted per search call from the reward

    @model_validator(mode="after")
    def _sizes(self) -> "SearchOptions":
        if not self.kinds:
            raise ValueError("kinds: needs at least one question kind")
        if self.top_k > self.candidates:
            raise ValueError(f"top_k = {self.top_k} exceeds candidates = {self.candidates}")
        if self.retriever not in retrievers.names():  # the options boundary does not read Registered marks inside an options block
            raise ValueError(f"retriever: no registered retriever {self.retriever!r} (known: {', '.join(retrievers.names())})")
        if self.retriever == "path" and not self.retriever_path:
            raise ValueError("retriever path needs retriever_path (a checkpoint directory)")
        return self


@tasks.register("search", options=SearchOptions)
class Search(Task):
    @cached_property
    def opts(self) -> SearchOptions:
        return self.cfg.options_for("search")

    @cached_property
    def corpus(self) -> Corpus:
        o = self.opts
        return build_corpus(o.people, o.companies, o.cities, o.corpus_seed)

    @cached_property
    def retriever(self) -> Retriever:
        o = self.opts
        extra = {"path": o.retriever_path} if o.retriever == "path" else {}
        return build_retriever(o.retriever, self.corpus.passages, **extra)

    @cached_property
    def retrieval(self) -> RetrievalPolicy:
        o = self.opts
        return RetrievalPolicy(self.retriever, o.top_k, o.candidates, o.tau, torch.Generator().manual_seed(o.corpus_seed), greedy=not o.stochastic)

    @cached_property
    def by_text(self) -> dict[str, Question]:
        return {q.text: q for q in self.corpus.questions}

    def question(self, example_or_prompt: Example | str) -> Question:
        prompt = example_or_prompt.prompt if isinstance(example_or_prompt, Example) else example_or_prompt
        found = self.by_text.get(question_of(prompt))
        if found is None:
            raise UserError(f"task search: {question_of(prompt)!r} is not a question of this corpus")
        return found

    def splits(self, seed: int) -> dict[str, list[Example]]:
        pool = [q for q in self.corpus.questions if q.kind in self.opts.kinds]
        wanted = self.cfg.n_train + self.cfg.n_heldout
        if wanted > len(pool):
            raise UserError(f"task.n_train + task.n_heldout = {wanted} exceeds the {len(pool)} questions of the search corpus "
                            "(grow task.options.search.people)")
        picked = random.Random(seed).sample(pool, wanted)
        examples = [self.example(q) for q in picked]
        return {"train": examples[: self.cfg.n_train], "heldout": examples[self.cfg.n_train :]}

    def example(self, q: Question) -> Example:
        greedy = RetrievalPolicy(self.retriever, self.opts.top_k, self.opts.candidates, self.opts.tau, greedy=True)
        passages = self.corpus.passages
        completion = reference_transcript(q, lambda query: [passages[i] for i in greedy(query)[0]])
        return Example(prompt=q.text, completion=completion, answer=q.answer, metadata={"gold": list(q.gold), "kind": q.kind})

    def parse(self, completion: str) -> str | None:
        return parse_answer(completion)

    def answer_score(self, completion: str, example: Example) -> float:
        score = exact_match if self.opts.reward == "em" else token_f1
        return score(self.parse(completion), example.answer)

    def correctness_reward(self, completion: str, finished: bool, example: Example) -> float:
        """EM or F1 of the answer minus cost_per_call x search calls."""
        return self.answer_score(completion, example) - self.opts.cost_per_call * len(search_queries(completion))

    def reference_verified(self, example: Example) -> bool:
        return self.format_reward(example.completion, True) == 1.0 and self.answer_score(example.completion, example) == 1.0

    def sample_metrics(self, completion: str, example: Example) -> dict[str, float]:
        answer = self.parse(completion)
        return {"em": exact_match(answer, example.answer), "f1": token_f1(answer, example.answer),
                "search_calls": float(len(search_queries(completion)))}

    def alphabet(self) -> str:
        return ALPHABET

    def episode(self, prompt: str, retrieval: RetrievalPolicy | None = None) -> SearchEpisode:
        return SearchEpisode(prompt, self.corpus, retrieval or self.retrieval, self.opts.max_calls)

    def sampler(self, tokenizer, retrieval: RetrievalPolicy | None = None):
        """Multi-turn episodes for the RL loop and the evaluation; the episodes of the latest call are kept in
        `self.last_episodes` (prompt-major, G per prompt), with their retrieval decisions."""

        def sample(model, prompt_ids, prompt_mask, *, group_size: int, max_new_tokens: int, eos_id: int, pad_id: int,
                   temperature: float = 1.0, greedy: bool = False, generator: torch.Generator | None = None):
            texts = tokenizer.batch_decode(prompt_ids.masked_fill(prompt_mask == 0, pad_id).cpu(), skip_special_tokens=True)
            episodes = [self.episode(text, retrieval) for text in texts for _ in range(group_size)]
            first = [e.reset() for e in episodes]
            self.last_episodes = episodes
            return multi_turn_sample(model, tokenizer, episodes, first, max_new_tokens, temperature, generator, greedy)

        return sample

    def recall(self, episodes: Sequence[SearchEpisode]) -> float:
        """Share of the gold supporting passages that some search call of the episode returned, averaged."""
        values = []
        for e in episodes:
            gold = set(self.question(e.prompt).gold)
            seen = {i for call in e.calls for i in call.passages}
            values.append(len(gold & seen) / len(gold))
        return sum(values) / max(len(values), 1)
