"""Retrievers behind one registry, and the stochastic retrieval policy RL reaches them through.

A `Retriever` scores a query against every passage of a corpus (`scores(queries) -> [Q, D]`); trainable ones are
`torch.nn.Module`s whose scores carry gradient. Registered:

- `bm25`: Okapi BM25 through the `bm25s` library (Lù, 2024, arXiv 2407.03618), no parameters;
- `dual_encoder`: a small dual encoder trained in the repo (hashed word + character-trigram bags, one tower per
  side, cosine similarity / temperature), trained contrastively with in-batch negatives (`train_dual_encoder`,
  the InfoNCE objective of DPR, Karpukhin et al., 2020, Eq. 2);
- `path`: any sentence-embedding checkpoint directory (transformers `AutoModel` + `AutoTokenizer`, offline),
  mean pooling over the attention mask and L2 normalisation, as sentence-transformers' all-MiniLM-L6-v2 does;
  frozen (its passage embeddings are computed once).

`RetrievalPolicy` is BRIDGE's retriever as a stochastic policy (spec §13): over the retriever's top-N candidates
P_phi(d | q) = softmax_d(s_phi(q, d) / tau); k passages are drawn without replacement (Plackett-Luce), and
`log_prob(events)` recomputes log P_phi(chosen | q) under the current parameters with gradient, the term of
the REINFORCE gradient  grad_phi J = E[A * sum_calls sum_d grad log P_phi(d | q)].
"""

from __future__ import annotations

import hashlib
import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from posttrain.errors import UserError
from posttrain.registry import Registry


class Retriever(ABC):
    """Scores queries against a fixed corpus."""

    trainable = False

    @abstractmethod
    def scores(self, queries: Sequence[str]) -> Tensor:
        """[Q, D] relevance scores (higher is better); with gradient for a trainable retriever."""

    def top(self, query: str, k: int) -> list[int]:
        with torch.no_grad():
            s = self.scores([query])[0]
        return torch.topk(s, min(k, s.numel())).indices.tolist()


retrievers: Registry[type[Retriever]] = Registry("retriever")


def build_retriever(name: str, passages: Sequence[str], **options) -> Retriever:
    return retrievers.get(name)(passages, **options)


@retrievers.register("bm25")
class BM25(Retriever):
    """Okapi BM25 (k1 = 1.5, b = 0.75, the `lucene` variant) over `bm25s`'s lower-cased word tokens (two or
    more word characters, no stop words removed: `p17`, `c3` are the words that matter here)."""

    def __init__(self, passages: Sequence[str], k1: float = 1.5, b: float = 0.75):
        import bm25s  # a dependency of this retriever only

        self._bm25s = bm25s
        self.index = bm25s.BM25(k1=k1, b=b)
        self.index.index(bm25s.tokenize(list(passages), stopwords=None, show_progress=False, return_ids=False), show_progress=False)
        self.size = len(passages)

    def scores(self, queries: Sequence[str]) -> Tensor:
        tokens = self._bm25s.tokenize(list(queries), stopwords=None, show_progress=False, return_ids=False)
        return torch.from_numpy(np.stack([self.index.get_scores(t) if t else np.zeros(self.size) for t in tokens])).float()


WORD = re.compile(r"\w+")


def hashed_features(text: str, buckets: int) -> list[int]:
    """Feature ids of a text: its lower-cased words and the character trigrams of each padded word, hashed
    (md5, stable across processes) into `buckets`."""
    out = []
    for word in WORD.findall(text.lower()):
        padded = f"#{word}#"
        grams = [word] + [padded[i : i + 3] for i in range(len(padded) - 2)]
        out += [int.from_bytes(hashlib.md5(g.encode()).digest()[:4], "little") % buckets for g in grams]
    return out or [0]


class Tower(nn.Module):
    def __init__(self, buckets: int, dim: int):
        super().__init__()
        self.bag = nn.EmbeddingBag(buckets, dim, mode="mean")
        self.proj = nn.Linear(dim, dim)

    def forward(self, features: list[list[int]]) -> Tensor:
        flat = torch.tensor([f for fs in features for f in fs], dtype=torch.long)
        offsets = torch.tensor([0] + [len(fs) for fs in features[:-1]], dtype=torch.long).cumsum(0)
        return nn.functional.normalize(self.proj(torch.tanh(self.bag(flat, offsets))), dim=-1)


@retrievers.register("dual_encoder")
class DualEncoder(nn.Module, Retriever):
    """A tiny dual encoder: s(q, d) = cos(E_q(q), E_d(d)) / temperature; every passage is re-encoded on each
    call (the corpus is a few thousand short passages), so the scores carry gradient to both towers."""

    trainable = True

    def __init__(self, passages: Sequence[str], buckets: int = 4096, dim: int = 32, temperature: float = 0.1, seed: int = 0):
        nn.Module.__init__(self)
        torch.manual_seed(seed)
        self.buckets, self.temperature = buckets, temperature
        self.query_tower, self.passage_tower = Tower(buckets, dim), Tower(buckets, dim)
        self.passage_features = [hashed_features(p, buckets) for p in passages]

    def encode_queries(self, queries: Sequence[str]) -> Tensor:
        return self.query_tower([hashed_features(q, self.buckets) for q in queries])

    def scores(self, queries: Sequence[str]) -> Tensor:
        return self.encode_queries(queries) @ self.passage_tower(self.passage_features).T / self.temperature


def train_dual_encoder(encoder: DualEncoder, pairs: Sequence[tuple[str, int]], steps: int, batch_size: int = 32, lr: float = 1e-2,
                       seed: int = 0) -> list[float]:
    """Contrastive training on (query, positive passage id) pairs, every other passage a negative (full-corpus
    softmax cross-entropy, the in-batch InfoNCE of DPR with the whole corpus as the batch). Returns the losses."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(encoder.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        pick = torch.randint(len(pairs), (min(batch_size, len(pairs)),), generator=generator).tolist()
        queries, positives = [pairs[i][0] for i in pick], torch.tensor([pairs[i][1] for i in pick])
        loss = nn.functional.cross_entropy(encoder.scores(queries), positives)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses


@retrievers.register("path")
class PathEncoder(Retriever):
    """A sentence-embedding checkpoint by directory: mean-pooled last hidden states, L2-normalised, cosine
    scores. Loaded with `local_files_only` (nothing downloads); frozen."""

    def __init__(self, passages: Sequence[str], path: str | None = None, batch_size: int = 64, max_length: int = 64):
        from transformers import AutoModel, AutoTokenizer

        if not path or not Path(path).is_dir():
            raise UserError(f"retriever path: no checkpoint directory at {path!r}")
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.model = AutoModel.from_pretrained(path, local_files_only=True).eval()
        self.batch_size, self.max_length = batch_size, max_length
        self.passage_embeddings = self.embed(passages)

    @torch.no_grad()
    def embed(self, texts: Sequence[str]) -> Tensor:
        out = []
        for i in range(0, len(texts), self.batch_size):
            enc = self.tokenizer(list(texts[i : i + self.batch_size]), padding=True, truncation=True, max_length=self.max_length, return_tensors="pt")
            hidden = self.model(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            out.append(nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9), dim=-1))
        return torch.cat(out)

    def scores(self, queries: Sequence[str]) -> Tensor:
        return self.embed(queries) @ self.passage_embeddings.T


# -- the stochastic retrieval policy -----------------------------------------------------------------------------


@dataclass(frozen=True)
class RetrievalEvent:
    query: str
    candidates: tuple[int, ...]  # the top-N corpus ids under the retriever when the call was made
    chosen: tuple[int, ...]  # the k drawn, in draw order (positions into the corpus, not into candidates)
    logp: float  # log P_phi(chosen | q) at sampling time


def plackett_luce_logp(logits: Tensor, order: Tensor) -> Tensor:
    """log P of drawing the indices `order` (into the last dim of `logits`) one after another without
    replacement from softmax(logits): sum_j [ logits[o_j] - logsumexp(logits without o_1..o_{j-1}) ]."""
    out = logits.new_zeros(())
    alive = torch.ones_like(logits, dtype=torch.bool)
    for o in order.tolist():
        out = out + logits[o] - torch.logsumexp(logits.masked_fill(~alive, float("-inf")), dim=-1)
        alive = alive.clone()
        alive[o] = False
    return out


class RetrievalPolicy:
    """softmax(s / tau) over the top-`candidates` passages, `k` drawn without replacement (greedy: the top k)."""

    def __init__(self, retriever: Retriever, k: int, candidates: int, tau: float, generator: torch.Generator | None = None,
                 greedy: bool = False):
        if not 1 <= k <= candidates:
            raise UserError(f"retrieval: top_k = {k} must be between 1 and candidates = {candidates}")
        self.retriever, self.k, self.candidates, self.tau = retriever, k, candidates, tau
        self.generator = generator or torch.Generator().manual_seed(0)
        self.greedy = greedy

    def distribution(self, query: str) -> tuple[list[int], Tensor]:
        """(candidate ids, P_phi(. | q) over them), no gradient."""
        with torch.no_grad():
            s = self.retriever.scores([query])[0].float()
        top = torch.topk(s, min(self.candidates, s.numel()))
        return top.indices.tolist(), torch.softmax(top.values / self.tau, dim=-1)

    def __call__(self, query: str) -> tuple[list[int], RetrievalEvent]:
        ids, probs = self.distribution(query)
        k = min(self.k, len(ids))
        order = torch.arange(k) if self.greedy else torch.multinomial(probs, k, replacement=False, generator=self.generator)
        logp = float(plackett_luce_logp(probs.clamp(min=1e-30).log(), order))
        chosen = tuple(ids[i] for i in order.tolist())
        return list(chosen), RetrievalEvent(query, tuple(ids), chosen, logp)

    def log_prob(self, events: Sequence[RetrievalEvent]) -> Tensor:
        """[E] log P_phi(chosen | q) of each event under the current parameters (with gradient when trainable),
        over the candidate set recorded at sampling time."""
        if not events:
            return torch.zeros(0)
        scores = self.retriever.scores([e.query for e in events])
        out = []
        for row, e in zip(scores, events):
            logits = row[list(e.candidates)] / self.tau
            position = {d: i for i, d in enumerate(e.candidates)}
            out.append(plackett_luce_logp(torch.log_softmax(logits, -1), torch.tensor([position[d] for d in e.chosen])))
        return torch.stack(out)
