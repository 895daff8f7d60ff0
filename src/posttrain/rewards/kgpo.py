"""RareDx-KGPO: a knowledge-graph graded reward for ranked differential diagnoses (2026; our formulation, derived
from its abstract). A prediction list D = (d_1..d_m) is canonicalised to graph nodes n_k (exact or synonym lookup;
duplicates of a node keep their first rank and add nothing). Against the gold node g and patient phenotypes H:

    rel(n) = 1                                                             if n = g
           = min(cap, w_g grade(n,g) + w_o exp(-dist(n,g)/tau_o) + w_b sim(n,g) + w_p |Phen(n) ∩ H|/|H|)   otherwise
    R_list = sum_{k <= min(m, K)} rel(n_k) / log2(k + 1)  /  IDCG          IDCG = 1 (one gold node)    [dcg]
    R      = R_list - c_v #unmapped - c_b max(0, m - K)                    clipped to [-1, 1]; 0 if malformed

`aggregation: dcg` is the clipped list reward above. Its clip to 1 has a flaw at small K: with the default cap 0.5,
a gold-free list of close relatives (0.5 + 0.5/log2 3 + 0.5/2 > 1) ties the exact answer, so RL can be paid
in full for never naming the gold. `aggregation: saturating` keeps the same rank-discounted gains
g_k = rel(n_k) / log2(k + 1) but combines them as R_list = 1 - prod_k (1 - g_k): still 1 for the gold at
rank 1, still monotone in every gain, and strictly below 1 for any list without the gold.

Vocabulary constraint: a name outside the graph (a fabrication) earns nothing and costs c_v. Output budget:
only the first K items count and each item beyond K costs c_b, so padding the list cannot harvest partial
credit. cap < 1 keeps every partial credit below an exact hit. The graph, grades, ontology distances and
embeddings come from the `diagnosis` task (tasks/diagnosis.py). Settings: rl.options.kgpo (params.yaml).
Invariants (tests/unit/test_kgpo.py): the gold alone at rank 1 scores 1, the maximum; appending a fabricated
name or an item beyond K never raises R; rel < 1 off gold; duplicates add nothing; demoting a relevant item
never raises R.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch
from pydantic import Field, model_validator
from torch import Tensor

from posttrain.config import Section
from posttrain.rewards import rewards
from posttrain.tasks.diagnosis import KnowledgeGraph, parse_differential, phenotypes_of


class KGPOOptions(Section):
    top_k: int = Field(3, ge=1)  # K: the output budget
    cap: float = Field(0.5, gt=0, lt=1)  # the most a non-gold node can earn
    w_grade: float = Field(0.4, ge=0)  # curated grade: 0.7 parent/subtype, 0.4 same group
    w_onto: float = Field(0.2, ge=0)  # ontology proximity exp(-hops / tau_o)
    w_emb: float = Field(0.2, ge=0)  # cosine of the graph embeddings
    w_phen: float = Field(0.2, ge=0)  # share of the patient's phenotypes the disease explains
    tau_o: float = Field(2.0, gt=0)  # ontology proximity scale, in hops
    c_vocab: float = Field(0.1, ge=0)  # penalty per unmapped (fabricated) name
    c_budget: float = Field(0.05, ge=0)  # penalty per item beyond K
    aggregation: Literal["dcg", "saturating"] = "saturating"  # how the discounted gains combine (see the module docstring)

    @model_validator(mode="after")
    def _some_weight(self) -> "KGPOOptions":
        if self.w_grade + self.w_onto + self.w_emb + self.w_phen <= 0:
            raise ValueError("w_grade + w_onto + w_emb + w_phen must be positive")
        return self


def relevance(graph: KnowledgeGraph, node: int, gold: int, patient: frozenset[int], opts: KGPOOptions) -> float:
    """rel(n): 1 on the gold node, else capped graded partial credit."""
    if node == gold:
        return 1.0
    partial = (
        opts.w_grade * graph.grade(node, gold)
        + opts.w_onto * math.exp(-graph.distance(node, gold) / opts.tau_o)
        + opts.w_emb * graph.similarity(node, gold)
        + opts.w_phen * graph.phenotype_overlap(node, patient)
    )
    return min(opts.cap, partial)


def list_reward(graph: KnowledgeGraph, names: Sequence[str] | None, gold: int, patient: frozenset[int], opts: KGPOOptions) -> float:
    """R for one ranked list of names (None: a malformed completion, R = 0)."""
    if names is None:
        return 0.0
    unmapped = 0
    seen: set[int] = set()
    gains = []
    for rank, name in enumerate(names, start=1):
        node = graph.canonical(name)
        if node is None:
            unmapped += 1
            continue
        if rank > opts.top_k or node in seen:  # beyond the budget, or a duplicate: no credit
            continue
        seen.add(node)
        gains.append(relevance(graph, node, gold, patient, opts) / math.log2(rank + 1))
    listed = sum(gains) if opts.aggregation == "dcg" else 1.0 - math.prod(1.0 - g for g in gains)  # IDCG = 1
    reward = listed - opts.c_vocab * unmapped - opts.c_budget * max(0, len(names) - opts.top_k)
    return max(-1.0, min(1.0, reward))


@rewards.register("kgpo", needs=("rl",), options=KGPOOptions, tasks=("diagnosis",))
def kgpo(task, examples, completions, finished, *, rl) -> Tensor:
    """Graph-graded differential reward; a completion not ended by EOS is malformed (R = 0)."""
    opts: KGPOOptions = rl.options_for("kgpo")
    graph = task.graph
    scores = [
        list_reward(graph, parse_differential(text) if done else None, graph.canonical(ex.answer), phenotypes_of(ex.prompt), opts)
        for ex, text, done in zip(examples, completions, finished)
    ]
    return torch.tensor(scores, dtype=torch.float32)
