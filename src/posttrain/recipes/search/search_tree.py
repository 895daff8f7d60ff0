"""The search environment (envs/search.py) as a recoverable environment for ASCT (recipes/search/recoverable.py).

A state is the question and what the episode has done so far (the queries, the passage ids each returned, the
answer once given): a value, so the auxiliary tree can continue any prefix the actor visited. The legal actions:

    ("search", "<entity> <relation>")   for every entity the episode has read (the question's subject and the
                                        entities of retrieved passages) and each relation word of the corpus
                                        (works / lives / based) not searched yet, while calls remain
    ("answer", "<entity>")              for every entity of a retrieved passage other than the subject, or
    ("answer", "unknown")               when nothing has been retrieved, or no calls remain and nothing was read

Retrieval is the task's retriever, top `top_k` passages per call (greedy: a state's continuation depends on the
actions alone). Utility: token F1 of the answer minus `cost_per_call` per search call (SQuAD F1 of envs/search.py).
A transition writes the action text (`<search>q</search>` / `<answer>x</answer>`) and, for a search, the
observation `<result>...</result>`: its characters are the tokens it spends (the search task's char tokenizer).

What a language-model actor reads (`text`): the question, then every call as the multi-turn episode writes it,
`<search>q</search><result>p | p</result>`; what it writes for an action (`action_text`): `<search>q</search>` or
`<answer>x</answer>` (the transition's tokens are the action text and the observation).

What the MLP actor sees of an action (`features`): what the action is (a query of a relation word about the subject or
about a read entity; an answer naming the object of a retrieved passage of a given relation, read about the subject
or about an entity read earlier), the share of calls used, and that description crossed with the question's kind
(which the question text states), so one actor can learn which query and which evidence answer which question.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from functools import lru_cache

import torch
from torch import Tensor

from posttrain.recipes.search.recoverable import RecoverableEnv
from posttrain.envs.search import (
    ALPHABET, ANSWER_CLOSE, ANSWER_OPEN, KINDS, SEARCH_CLOSE, SEARCH_OPEN, Corpus, Question, observation, reference_transcript, token_f1,
)

RELATIONS = ("works", "lives", "based")  # the relation words a query can name
PASSAGE_RELATIONS = ("works at", "lives in", "is based in", "visited", "was born in", "opened an office in")
PASSAGE = re.compile(r"^(\S+) (.+) (\S+)$")
UNKNOWN = "unknown"
DESCRIPTOR = (3 + len(RELATIONS)) + (3 + 2 * len(PASSAGE_RELATIONS)) + 1  # per action, before crossing with the question kind


@dataclass(frozen=True)
class SearchState:
    question: Question
    queries: tuple[str, ...] = ()
    results: tuple[tuple[int, ...], ...] = ()
    answer: str | None = None


def parse_passage(text: str) -> tuple[str, str, str] | None:
    """(subject, relation, object) of a corpus passage such as `p17 works at c3`."""
    m = PASSAGE.match(text)
    return (m.group(1), m.group(2), m.group(3)) if m and m.group(2) in PASSAGE_RELATIONS else None


def subject_of(question: Question) -> str:
    return next(w.rstrip("?").removesuffix("'s") for w in question.text.split() if re.fullmatch(r"p\d+(\?|'s)?", w))


class SearchTreeEnv(RecoverableEnv[SearchState]):
    n_features = DESCRIPTOR * (1 + len(KINDS))

    def __init__(self, corpus: Corpus, retriever, top_k: int, max_calls: int, cost_per_call: float):
        self.corpus, self.top_k, self.max_calls, self.cost_per_call = corpus, top_k, max_calls, cost_per_call
        self.parsed = [parse_passage(p) for p in corpus.passages]
        self._search = lru_cache(maxsize=None)(lambda query: tuple(retriever.top(query, top_k)))

    def start(self, question: Question) -> SearchState:
        return SearchState(question)

    def read(self, s: SearchState) -> list[tuple[str, str, str]]:
        """The (subject, relation, object) facts of every passage retrieved so far, in order, without repeats."""
        seen = dict.fromkeys(i for ids in s.results for i in ids)
        return [self.parsed[i] for i in seen if self.parsed[i] is not None]

    def legal_actions(self, s: SearchState) -> list[tuple[str, str]]:
        subject, facts = subject_of(s.question), self.read(s)
        entities = list(dict.fromkeys([subject, *(e for f in facts for e in (f[0], f[2]))]))
        out = []
        if len(s.queries) < self.max_calls:
            out += [("search", f"{e} {r}") for e in entities for r in RELATIONS if f"{e} {r}" not in s.queries]
        answers = [e for e in dict.fromkeys(f[2] for f in facts) if e != subject]
        return out + [("answer", a) for a in answers] if answers else out + [("answer", UNKNOWN)]

    def step(self, s: SearchState, action: tuple[str, str]) -> SearchState:
        kind, text = action
        if kind == "answer":
            return replace(s, answer=text)
        return replace(s, queries=(*s.queries, text), results=(*s.results, self._search(text)))

    def done(self, s: SearchState) -> bool:
        return s.answer is not None

    def utility(self, s: SearchState) -> float:
        return token_f1(None if s.answer in (None, UNKNOWN) else s.answer, s.question.answer) - self.cost_per_call * len(s.queries)

    def calls(self, s: SearchState) -> int:
        return len(s.queries)

    def tokens(self, s: SearchState, action: tuple[str, str]) -> int:
        kind, text = action
        written = len(self.action_text(action))
        return written if kind == "answer" else written + len(self.observation(self._search(text)))

    def observation(self, ids: tuple[int, ...]) -> str:
        return observation([self.corpus.passages[i] for i in ids])

    def alphabet(self) -> str:
        return ALPHABET

    def text(self, s: SearchState) -> str:
        return s.question.text + "".join(SEARCH_OPEN + q + SEARCH_CLOSE + self.observation(ids) for q, ids in zip(s.queries, s.results))

    def action_text(self, action: tuple[str, str]) -> str:
        kind, text = action
        return ANSWER_OPEN + text + ANSWER_CLOSE if kind == "answer" else SEARCH_OPEN + text + SEARCH_CLOSE

    def demonstration(self, question: Question) -> tuple[str, str]:
        """The question and its reference transcript (the reference queries, what retrieval returns, the gold answer)."""
        return question.text, reference_transcript(question, lambda query: [self.corpus.passages[i] for i in self._search(query)])

    def describe(self, s: SearchState, action: tuple[str, str], subject: str, facts) -> list[float]:
        kind, text = action
        calls = len(s.queries) / self.max_calls
        query = [0.0] * (3 + len(RELATIONS))
        answer = [0.0] * (3 + 2 * len(PASSAGE_RELATIONS))
        if kind == "search":
            entity, relation = text.split(" ", 1)
            query[:3] = [1.0, float(entity == subject), float(entity != subject)]
            query[3 + RELATIONS.index(relation)] = 1.0
        else:
            answer[:3] = [1.0, float(text == UNKNOWN), float(sum(f[2] == text for f in facts) > 1)]
            for f in facts:
                if f[2] == text:  # evidence for this answer: a passage about the subject, or about an entity read earlier
                    answer[3 + 2 * PASSAGE_RELATIONS.index(f[1]) + int(f[0] != subject)] = 1.0
        return [*query, *answer, calls]

    def features(self, s: SearchState, actions: list[tuple[str, str]]) -> Tensor:
        subject, facts = subject_of(s.question), self.read(s)
        base = torch.tensor([self.describe(s, a, subject, facts) for a in actions], dtype=torch.float32)
        kind = torch.zeros(len(KINDS))
        kind[KINDS.index(s.question.kind)] = 1.0
        return torch.cat([base, (kind[None, :, None] * base[:, None, :]).flatten(1)], dim=1)

    def figures(self, s: SearchState) -> dict[str, float]:
        """Per episode: F1 (and exact match) of the answer, search calls, recall of the gold passages."""
        f1 = token_f1(None if s.answer in (None, UNKNOWN) else s.answer, s.question.answer)
        found = {i for ids in s.results for i in ids}
        return {"f1": f1, "em": float(f1 == 1.0), "calls": float(len(s.queries)),
                "recall": sum(g in found for g in s.question.gold) / len(s.question.gold)}

    def transcript(self, s: SearchState) -> dict[str, str]:
        """An episode as a table row: the question, the queries, the passages each returned, the answer and the gold."""
        return {"question": s.question.text, "queries": " || ".join(s.queries),
                "passages": " || ".join(" | ".join(self.corpus.passages[i] for i in ids) for ids in s.results),
                "answer": s.answer or "", "gold": s.question.answer}
