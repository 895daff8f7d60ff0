"""SDRL, Strategy-Diverse RL: a correctness-gated hierarchical diversity reward (2026; derived from its
abstract). Among the correct rollouts C of a group, with strategy labels k and n_k = |{j in C: k_j = k}|:

    D_b(i) = 1 - n_{k_i} / |C|                                        between strategies (0 if all share one)
    D_w(i) = mean_{j in C, k_j = k_i, j != i} [1 - sim(y_i, y_j)]      within a strategy (0 if alone)
    R_i    = c_i (1 + beta_b D_b(i) + beta_w D_w(i))                   c_i: the task's verifier

The formulation's small format term f_i is the separate `format` reward; GRPO/GDPO on R is the configured estimator.
Strategy k_i: the first label in `strategies` with a regex found in the completion (code analysis by
pattern), else `fallback`. sim: difflib ratio over word/punctuation tokens, in [0, 1]. A group is a run of
consecutive rows sharing one Example object (how the trainer expands prompts).
Invariants: c = 0 => no bonus; D in [0, 1], R <= 1 + beta_b + beta_w; one strategy => D_b = 0;
permutation-invariant in a group; a strategy used by a single correct rollout gets the largest D_b.
Settings: rl.options.sdrl (defaults on its options model below); needs the rl settings (`needs=("rl",)`).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence

import torch
from pydantic import Field, field_validator
from torch import Tensor

from posttrain.config import Section
from posttrain.rewards import rewards

_TOKEN = re.compile(r"\w+|[^\w\s]")


class SDRLOptions(Section):
    beta_b: float = Field(0.2, ge=0)  # weight of the between-strategy bonus
    beta_w: float = Field(0.1, ge=0)  # weight of the within-strategy bonus
    strategies: dict[str, tuple[str, ...]] = {  # label -> regexes, checked in order; first label that matches wins
        "solver": (r"\b(gurobipy|pyomo|pulp|ortools|cp_model|cvxpy|linprog|milp)\b",),
        "exact": (r"branch.and.bound", r"\bdp\[", r"\b(dijkstra|bellman|memo|lru_cache|networkx)\b", r"itertools\.(permutations|product|combinations)"),
        "heuristic": (r"local.search", r"simulated.anneal", r"\b(genetic|greedy|tabu|mutation)\b", r"random\.(random|choice|shuffle|randint)"),
    }
    fallback: str = "other"  # the label of a completion no pattern matches

    @field_validator("strategies")
    @classmethod
    def _patterns_compile(cls, v: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
        for label, patterns in v.items():
            for p in patterns:
                try:
                    re.compile(p)
                except re.error as e:
                    raise ValueError(f"strategy {label!r}: bad regex {p!r} ({e})") from None
        return v


def strategy_of(text: str, opts: SDRLOptions) -> str:
    for label, patterns in opts.strategies.items():
        if any(re.search(p, text) for p in patterns):
            return label
    return opts.fallback


def similarity(a: str, b: str) -> float:
    """Normalised token edit similarity in [0, 1] (1 for identical token sequences)."""
    return difflib.SequenceMatcher(None, _TOKEN.findall(a), _TOKEN.findall(b), autojunk=False).ratio()


def groups_of(examples: Sequence[object]) -> Tensor:
    """Group id per row: a new id wherever the Example object changes."""
    ids, current = [], -1
    for i, e in enumerate(examples):
        current += int(i == 0 or e is not examples[i - 1])
        ids.append(current)
    return torch.tensor(ids, dtype=torch.long)


def diversity_bonuses(correct: Tensor, labels: Sequence[str], texts: Sequence[str], group: Tensor) -> tuple[Tensor, Tensor]:
    """(D_b, D_w) [N], both 0 on incorrect rows."""
    n = len(texts)
    d_b, d_w = torch.zeros(n), torch.zeros(n)
    for g in torch.unique(group):
        members = [i for i in range(n) if group[i] == g and bool(correct[i])]
        for i in members:
            same = [j for j in members if labels[j] == labels[i]]
            d_b[i] = 1.0 - len(same) / len(members)
            others = [j for j in same if j != i]
            if others:
                d_w[i] = sum(1.0 - similarity(texts[i], texts[j]) for j in others) / len(others)
    return d_b, d_w


def sdrl_reward(correct: Tensor, d_b: Tensor, d_w: Tensor, opts: SDRLOptions) -> Tensor:
    return correct * (1.0 + opts.beta_b * d_b + opts.beta_w * d_w)


@rewards.register("sdrl", needs=("rl",), options=SDRLOptions)
def sdrl(task, examples, completions, finished, *, rl) -> Tensor:
    """Correctness times (1 + hierarchical strategy-diversity bonus among the group's correct rollouts)."""
    opts: SDRLOptions = rl.options_for("sdrl")
    correct = torch.tensor([task.correctness_reward(c, f, e) for c, f, e in zip(completions, finished, examples)])
    labels = [strategy_of(c, opts) for c in completions]
    d_b, d_w = diversity_bonuses(correct > 0, labels, completions, groups_of(examples))
    return sdrl_reward(correct, d_b, d_w, opts)
