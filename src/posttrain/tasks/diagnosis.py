"""Ranked differential diagnosis over a small synthetic phenotype–gene–disease graph (for `kgpo`, RareDx-KGPO, 2026).

The graph is a three-level disease ontology  root -> group -> parent disease -> subtype  (groups, parents
and subtypes are all diagnosable diseases except the root and the groups). Every disease carries phenotypes
inherited down the ontology (one per group, one per parent) plus `own_phenotypes` of its own, and a causal
gene (subtypes share their parent's gene). Disease names are codes: a primary name `D07` and a synonym `M07`
(the two ontologies of the real task, MONDO and OMIM, map to one node); any other code is a fabrication.

    prompt      "h41,h03,h17>"       the patient's phenotypes H (a shuffled subset of the gold disease's)
    completion  "D07,D08,D06"        a ranked differential, ended by EOS (references: gold + 0..top_k-1 relatives)
    correct     the gold disease is ranked first (after canonicalisation: `M07` counts as `D07`)

Every prompt shows `shown_phenotypes` of the gold disease's phenotypes, at least one of them its own, so
the gold disease is always identifiable; a differential's later items earn the graded partial credit of the
`kgpo` reward. Distinct prompts are (disease, phenotype subset, order) triples; the splits are disjoint.
Settings: task.options.diagnosis (defaults on its options model).
"""

from __future__ import annotations

import itertools
import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from pydantic import Field, model_validator

from posttrain.config import Section
from posttrain.errors import UserError
from posttrain.tasks import tasks
from posttrain.tasks.base import Example, Task

_ITEM = r"[DM][0-9]{2}"
_LIST = re.compile(rf"{_ITEM}(,{_ITEM})*")


class DiagnosisOptions(Section):
    groups: int = Field(3, ge=1)  # ontology: root -> groups -> parent diseases -> subtypes
    parents_per_group: int = Field(3, ge=1)
    subtypes_per_parent: int = Field(2, ge=0)
    own_phenotypes: int = Field(3, ge=1)  # phenotypes specific to one disease
    shown_phenotypes: int = Field(3, ge=1, le=6)  # |H|: phenotypes in a prompt
    top_k: int = Field(3, ge=1)  # the longest reference differential (1..top_k items; the kgpo budget is rl.options.kgpo.top_k)
    graph_seed: int = 0

    @model_validator(mode="after")
    def _fits(self) -> "DiagnosisOptions":
        if self.n_diseases > 100:
            raise ValueError(f"{self.n_diseases} diseases do not fit two-digit codes (at most 100)")
        if self.n_phenotypes > 100:
            raise ValueError(f"{self.n_phenotypes} phenotypes do not fit two-digit codes (at most 100)")
        if self.shown_phenotypes > self.own_phenotypes + 2:  # a disease has a group, a parent and its own phenotypes
            raise ValueError(f"shown_phenotypes {self.shown_phenotypes} exceeds the {self.own_phenotypes + 2} phenotypes of a disease")
        return self

    @property
    def n_diseases(self) -> int:
        return self.groups * self.parents_per_group * (1 + self.subtypes_per_parent)

    @property
    def n_phenotypes(self) -> int:
        return self.groups + self.groups * self.parents_per_group + self.n_diseases * self.own_phenotypes


@dataclass(frozen=True)
class Disease:
    node: int  # index into KnowledgeGraph.diseases; its primary name is D<node:02d>
    group: int
    parent: int | None  # the parent disease's node for a subtype, None for a parent disease
    phenotypes: frozenset[int]  # Phen(n): inherited from its group and parent, plus its own
    inherited: frozenset[int]  # the group's and the parent's phenotypes (shared with relatives)
    gene: int


class KnowledgeGraph:
    """The disease ontology with phenotype and gene annotations, and the name vocabulary."""

    def __init__(self, opts: DiagnosisOptions):
        rng = random.Random(opts.graph_seed)
        own = list(range(opts.groups * (1 + opts.parents_per_group), opts.n_phenotypes))
        rng.shuffle(own)  # so a phenotype's code says nothing about its disease
        diseases: list[Disease] = []
        for g in range(opts.groups):
            for p in range(opts.parents_per_group):
                parent_ph = opts.groups + g * opts.parents_per_group + p
                gene = g * opts.parents_per_group + p
                inherited = {g, parent_ph}
                parent_node = len(diseases)
                for s in range(1 + opts.subtypes_per_parent):
                    mine = {own.pop() for _ in range(opts.own_phenotypes)}
                    diseases.append(Disease(len(diseases), g, None if s == 0 else parent_node, frozenset(inherited | mine), frozenset(inherited), gene))
        self.diseases = tuple(diseases)
        self.n_phenotypes = opts.n_phenotypes
        self.n_genes = opts.groups * opts.parents_per_group
        self.vocabulary = {f"{prefix}{d.node:02d}": d.node for d in diseases for prefix in "DM"}

    def canonical(self, name: str) -> int | None:
        """The node a disease name maps to (exact or synonym lookup), None for a name outside the vocabulary."""
        return self.vocabulary.get(name)

    def grade(self, n: int, g: int) -> float:
        """Curated graded relevance: 1 exact, 0.7 parent and its subtype, 0.4 same group, else 0."""
        a, b = self.diseases[n], self.diseases[g]
        if n == g:
            return 1.0
        if a.parent == g or b.parent == n:
            return 0.7
        return 0.4 if a.group == b.group else 0.0

    def distance(self, n: int, g: int) -> int:
        """Hops between two diseases in the ontology tree (groups and a root above the parents)."""
        if n == g:
            return 0
        a, b = self.diseases[n], self.diseases[g]
        depth = lambda d: 2 if d.parent is None else 3  # noqa: E731  (root 0, group 1)
        if self._family(a) == self._family(b):
            return 1 if (a.parent is None or b.parent is None) else 2
        if a.group == b.group:
            return depth(a) - 1 + depth(b) - 1
        return depth(a) + depth(b)

    def similarity(self, n: int, g: int) -> float:
        """max(0, cos) between the diseases' embeddings: the graph's phenotype and gene incidence vectors (the
        spec uses a biomedical text encoder; none can be downloaded, and on codes it would see nothing)."""
        a, b = self._embedding[n], self._embedding[g]
        dot = len(a & b)
        return max(0.0, dot / math.sqrt(len(a) * len(b)))

    def phenotype_overlap(self, n: int, patient: frozenset[int]) -> float:
        """|Phen(n) ∩ H| / |H|."""
        return len(self.diseases[n].phenotypes & patient) / len(patient)

    def _family(self, d: Disease) -> int:
        return d.node if d.parent is None else d.parent

    @cached_property
    def _embedding(self) -> tuple[frozenset[tuple[str, int]], ...]:
        return tuple(frozenset({("gene", d.gene), *(("ph", p) for p in d.phenotypes)}) for d in self.diseases)


def parse_differential(completion: str) -> list[str] | None:
    """The ranked names of a well-formed differential (comma-separated codes), else None."""
    return completion.split(",") if _LIST.fullmatch(completion) else None


def phenotypes_of(prompt: str) -> frozenset[int]:
    return frozenset(int(item[1:]) for item in prompt.rstrip(">").split(","))


@tasks.register("diagnosis", options=DiagnosisOptions)
class Diagnosis(Task):
    @cached_property
    def opts(self) -> DiagnosisOptions:
        return self.cfg.options_for("diagnosis")

    @cached_property
    def graph(self) -> KnowledgeGraph:
        return KnowledgeGraph(self.opts)

    def splits(self, seed: int) -> dict[str, list[Example]]:
        candidates = [
            (d.node, shown)
            for d in self.graph.diseases
            for shown in itertools.combinations(sorted(d.phenotypes), self.opts.shown_phenotypes)
            if set(shown) - d.inherited  # at least one phenotype of its own: the gold is identifiable
        ]
        orders = math.factorial(self.opts.shown_phenotypes)
        wanted = self.cfg.n_train + self.cfg.n_heldout
        if wanted > len(candidates) * orders:
            raise UserError(
                f"task.n_train + task.n_heldout = {wanted} exceeds the {len(candidates) * orders} distinct diagnosis prompts "
                "(grow task.options.diagnosis)"
            )
        rng = random.Random(seed)
        picks = rng.sample(range(len(candidates) * orders), wanted)
        examples = []
        for i in picks:
            node, shown = candidates[i // orders]
            order = next(itertools.islice(itertools.permutations(shown), i % orders, None))
            examples.append(self._example(node, order, 1 + rng.randrange(self.opts.top_k)))
        return {"train": examples[: self.cfg.n_train], "heldout": examples[self.cfg.n_train :]}

    def _example(self, node: int, shown: Sequence[int], length: int) -> Example:
        prompt = ",".join(f"h{p:02d}" for p in shown) + ">"
        patient = frozenset(shown)
        others = sorted(
            (n for n in range(len(self.graph.diseases)) if n != node),
            key=lambda n: (-self.graph.grade(n, node), -self.graph.phenotype_overlap(n, patient), n),
        )
        ranked = [node, *others[: length - 1]]  # the reference: gold first, then some of its closest relatives
        gold = f"D{node:02d}"
        return Example(prompt=prompt, completion=",".join(f"D{n:02d}" for n in ranked), answer=gold)

    def parse(self, completion: str) -> str | None:
        names = parse_differential(completion)
        return None if names is None else names[0]

    def correctness_reward(self, completion: str, finished: bool, example: Example) -> float:
        """1.0 when the first-ranked name maps to the gold disease (Hit@1)."""
        return float(self.hit_at(completion, example, 1))

    def hit_at(self, completion: str, example: Example, k: int) -> bool:
        """Hit@k: the gold disease is among the first k canonicalised names."""
        names = parse_differential(completion) or []
        gold = self.graph.canonical(example.answer)
        return any(self.graph.canonical(name) == gold for name in names[:k])

    def sample_metrics(self, completion: str, example: Example) -> dict[str, float]:
        names = parse_differential(completion) or []
        return {
            f"hit_at_{self.opts.top_k}": float(self.hit_at(completion, example, self.opts.top_k)),
            "fabricated_names": float(sum(self.graph.canonical(n) is None for n in names)),
            "list_length": float(len(names)),
        }

    def alphabet(self) -> str:
        return "0123456789,>DMh"
