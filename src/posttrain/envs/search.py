"""A search environment over a seeded synthetic corpus: multi-hop questions answered with `<search>` calls.

The world (one per `corpus_seed`, the same for every pipeline seed): people `p0..`, companies `c0..` and cities
`t0..`. Each person works at a company and lives in a city; each company is based in a city. The corpus has one
short passage per fact plus distractors that share the entity and the shape of a gold passage but state a
different, irrelevant fact (near-duplicates: `p17 visited c9`, `p17 was born in t2`, `c3 opened an office in
t8`), so a retriever that matches only the entity returns wrong evidence.

Questions (gold answer, gold supporting passages):

    who employs p17?                   -> c3   [p17 works at c3]                       (1 hop)
    where does p17 live?               -> t4   [p17 lives in t4]                       (1 hop)
    where is p17's employer based?     -> t5   [p17 works at c3, c3 is based in t5]    (2 hops)

The policy writes `<search>query</search>`; the environment answers `<result>passage | passage</result>` with
the retriever's top-k passages (observation tokens: masked from the loss by envs/rollout.py) and the episode ends
at `<answer>...</answer>`. The environment receives actions token by token (one character with the char
tokenizer, any string otherwise) and acts when a closing tag completes. Reward: exact match or token F1 of the
answer (SQuAD normalisation), minus `cost_per_call` per search call (tasks/search.py). The retriever is any
`RetrievalPolicy` (envs/retrievers.py); every call is recorded on the episode (`calls`), so a learner of the
retriever (BRIDGE) can reach the retrieval decisions.
"""

from __future__ import annotations

import random
import re
import string
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from posttrain.envs.base import Env, Step

SEARCH_OPEN, SEARCH_CLOSE = "<search>", "</search>"
RESULT_OPEN, RESULT_CLOSE = "<result>", "</result>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
SEPARATOR = " | "
KINDS = ("employer", "home", "hq")  # the question kinds: who employs, where lives (1 hop), where is the employer based (2 hops)
ALPHABET = string.ascii_lowercase + string.digits + " ?'|<>/"


@dataclass(frozen=True)
class Question:
    text: str
    answer: str
    gold: tuple[int, ...]  # the corpus ids of the supporting passages, in hop order
    kind: str
    queries: tuple[str, ...]  # the reference search queries, one per hop


@dataclass(frozen=True)
class Corpus:
    passages: tuple[str, ...]
    questions: tuple[Question, ...]  # every question the world supports (kinds x people)


def build_corpus(people: int, companies: int, cities: int, seed: int) -> Corpus:
    """The seeded world, its passages (gold facts and distractors, shuffled) and every question over it."""
    rng = random.Random(seed)
    works = [rng.randrange(companies) for _ in range(people)]
    lives = [rng.randrange(cities) for _ in range(people)]
    based = [rng.randrange(cities) for _ in range(companies)]
    facts: list[tuple[str, str]] = []  # (key, passage); keys name the gold facts
    for p in range(people):
        facts.append((f"works{p}", f"p{p} works at c{works[p]}"))
        facts.append((f"lives{p}", f"p{p} lives in t{lives[p]}"))
        facts.append(("", f"p{p} visited c{_other(rng, companies, works[p])}"))
        facts.append(("", f"p{p} was born in t{_other(rng, cities, lives[p])}"))
    for c in range(companies):
        facts.append((f"based{c}", f"c{c} is based in t{based[c]}"))
        facts.append(("", f"c{c} opened an office in t{_other(rng, cities, based[c])}"))
    rng.shuffle(facts)
    index = {key: i for i, (key, _) in enumerate(facts) if key}
    questions = []
    for p in range(people):
        questions.append(Question(f"who employs p{p}?", f"c{works[p]}", (index[f"works{p}"],), "employer", (f"p{p} works",)))
        questions.append(Question(f"where does p{p} live?", f"t{lives[p]}", (index[f"lives{p}"],), "home", (f"p{p} lives",)))
        questions.append(Question(f"where is p{p}'s employer based?", f"t{based[works[p]]}", (index[f"works{p}"], index[f"based{works[p]}"]),
                                  "hq", (f"p{p} works", f"c{works[p]} based")))
    return Corpus(tuple(text for _, text in facts), tuple(questions))


def _other(rng: random.Random, n: int, avoid: int) -> int:
    """A value in range(n) other than `avoid` (a distractor's entity; n >= 2)."""
    return (avoid + 1 + rng.randrange(n - 1)) % n


# -- the answer format and its scores ----------------------------------------------------------------------------


def strip_observations(text: str) -> str:
    """The policy's own text: `<result>...</result>` blocks removed (a reference transcript carries them; the
    decoded rollout text does not)."""
    return re.sub(re.escape(RESULT_OPEN) + r".*?" + re.escape(RESULT_CLOSE), "", text, flags=re.S)


def search_queries(text: str) -> list[str]:
    return [q.strip() for q in re.findall(re.escape(SEARCH_OPEN) + r"(.*?)" + re.escape(SEARCH_CLOSE), strip_observations(text), flags=re.S)]


def parse_answer(text: str) -> str | None:
    """The text of the first `<answer>...</answer>` after the searches, or None when there is none."""
    found = re.search(re.escape(ANSWER_OPEN) + r"(.*?)" + re.escape(ANSWER_CLOSE), strip_observations(text), flags=re.S)
    return None if found is None else found.group(1).strip()


def normalize(text: str) -> str:
    """SQuAD's answer normalisation: lower case, punctuation and articles removed, whitespace collapsed."""
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    return " ".join(w for w in text.split() if w not in ("a", "an", "the"))


def exact_match(prediction: str | None, gold: str) -> float:
    return float(prediction is not None and normalize(prediction) == normalize(gold))


def token_f1(prediction: str | None, gold: str) -> float:
    """SQuAD token F1 (Rajpurkar et al., 2016): harmonic mean of token precision and recall after normalisation."""
    if prediction is None:
        return 0.0
    pred, ref = normalize(prediction).split(), normalize(gold).split()
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def observation(passages: Sequence[str]) -> str:
    return RESULT_OPEN + SEPARATOR.join(passages) + RESULT_CLOSE


def reference_transcript(question: Question, search) -> str:
    """The reference completion: the reference queries, what `search(query) -> passages` returns for each, and the
    answer (the SFT demonstration; the observations are the environment's, as in an episode)."""
    out = ""
    for query in question.queries:
        out += SEARCH_OPEN + query + SEARCH_CLOSE + observation(search(query))
    return out + ANSWER_OPEN + question.answer + ANSWER_CLOSE


# -- the environment ---------------------------------------------------------------------------------------------


@dataclass
class SearchCall:
    query: str
    passages: tuple[int, ...]  # the corpus ids returned
    event: object = None  # the retrieval policy's record of the decision (envs/retrievers.py RetrievalEvent), if any


@dataclass
class SearchEpisode(Env):
    """One question. `search(query) -> (passage ids, event)` is the retrieval policy; `max_calls` searches at most
    (one more ends the episode, unanswered)."""

    prompt: str
    corpus: Corpus
    search: object  # Callable[[str], tuple[list[int], object]]
    max_calls: int
    calls: list[SearchCall] = field(default_factory=list)
    text: str = ""

    def reset(self) -> str:
        self.calls, self.text = [], ""
        return self.prompt

    def step(self, action: str) -> Step:
        self.text += action
        if self.text.endswith(ANSWER_CLOSE):
            answer = parse_answer(self.text)
            return Step("", 0.0 if answer is None else 1.0, True)
        if not self.text.endswith(SEARCH_CLOSE):
            return Step("", 0.0, False)
        queries = search_queries(self.text)
        if len(queries) <= len(self.calls):  # a closing tag without an opening one: just text
            return Step("", 0.0, False)
        if len(self.calls) >= self.max_calls:
            return Step("", 0.0, True)
        ids, event = self.search(queries[-1])
        self.calls.append(SearchCall(queries[-1], tuple(ids), event))
        return Step(observation([self.corpus.passages[i] for i in ids]), 0.0, False)


def question_of(prompt: str) -> str:
    """The question in a prompt (a chat template may wrap it; the question is its last line)."""
    return prompt.strip().splitlines()[-1].strip()
