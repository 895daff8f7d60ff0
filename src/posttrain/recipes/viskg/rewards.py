"""VisKG's output parser and its three rewards (specs §29), separately normalised by GDPO (objectives/gdpo.py):

    output  <kg>(h1, r1, t1); (h2, r2, t2); ...</kg><think>...</think><answer>...</answer>
            (the full-caption arm writes <caption>...</caption> in the graph's place, in the same triple syntax)
    r_acc = 1[answer == the true answer]                                  (exact match, whitespace-insensitive)
    r_fmt = 1[the three blocks present, in order, and the graph parses into >= 1 triple]
    r_kg  = 1 - min(1, |graph tokens| / T_budget) when the graph parses, else 0     (compactness)

A graph parses when it is a `;`-separated list of `( head , relation , tail )` with exactly three non-empty
fields each and nothing else; any other text is unparseable (`parse_graph` returns None) and earns no format
reward. An unparseable graph earns no compactness either: an empty output is not "compact".

The three are registered as `viskg_accuracy`, `viskg_format`, `viskg_compactness` (columns of the core RL step's reward
matrix); they read the representation's tag, the budget and the token counter from the run's task (`VisKGTask`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from posttrain.rewards import rewards

LAYOUT = re.compile(r"^\s*<(kg|caption)>(.*?)</\1>\s*<think>(.*?)</think>\s*<answer>(.*?)</answer>\s*$", re.S)
TRIPLE = re.compile(r"^\s*\(([^(),;]*),([^(),;]*),([^(),;]*)\)\s*$")
REWARD_NAMES = ("accuracy", "format", "compactness")


@dataclass(frozen=True)
class Parsed:
    tag: str | None  # "kg" | "caption" | None (the layout did not match)
    graph: tuple[tuple[str, str, str], ...] | None  # None: unparseable
    graph_text: str
    think: str | None
    answer: str | None


def parse_graph(text: str) -> tuple[tuple[str, str, str], ...] | None:
    """The triples of a graph block's text, or None when any piece is not a 3-field triple with non-empty fields."""
    pieces = text.split(";")
    triples = []
    for piece in pieces:
        match = TRIPLE.match(piece)
        if match is None:
            return None
        fields = tuple(" ".join(f.split()) for f in match.groups())
        if not all(fields):
            return None
        triples.append(fields)
    return tuple(triples) if triples else None


def parse_output(text: str) -> Parsed:
    match = LAYOUT.match(text)
    if match is None:
        return Parsed(None, None, "", None, None)
    tag, graph_text, think, answer = match.groups()
    return Parsed(tag, parse_graph(graph_text), graph_text, think.strip(), " ".join(answer.split()))


def accuracy_reward(parsed: Parsed, answer: str) -> float:
    return float(parsed.answer is not None and parsed.answer == answer)


def format_reward(parsed: Parsed, tag: str) -> float:
    return float(parsed.tag == tag and parsed.graph is not None and len(parsed.graph) >= 1)


def compactness_reward(parsed: Parsed, graph_tokens: int, budget: int) -> float:
    return 1.0 - min(1.0, graph_tokens / budget) if parsed.graph is not None else 0.0


def graph_token_count(parsed: Parsed, count_tokens) -> int:
    """Tokens of the graph block's content (`count_tokens(text) -> int`: the policy's tokenizer)."""
    return int(count_tokens(parsed.graph_text)) if parsed.tag else 0


def reward_row(text: str, answer: str, tag: str, budget: int, count_tokens) -> tuple[float, float, float]:
    """(r_acc, r_fmt, r_kg) of one completion."""
    parsed = parse_output(text)
    return (accuracy_reward(parsed, answer), format_reward(parsed, tag),
            compactness_reward(parsed, graph_token_count(parsed, count_tokens), budget))


# -- registered, for the core RL step (stage viskg_rl): the task is recipes/viskg/policy.py's VisKGTask ------------------

def _column(task, examples, completions: Sequence[str], k: int) -> Tensor:
    return torch.tensor([task.reward_row(c, e)[k] for c, e in zip(completions, examples)], dtype=torch.float32)


@rewards.register("viskg_accuracy", tasks=("viskg",))
def viskg_accuracy(task, examples, completions: Sequence[str], finished) -> Tensor:
    """VisKG's r_acc: 1 when the answer block is the true answer (stage viskg_rl)."""
    return _column(task, examples, completions, 0)


@rewards.register("viskg_format", tasks=("viskg",))
def viskg_format(task, examples, completions: Sequence[str], finished) -> Tensor:
    """VisKG's r_fmt: 1 when the graph, think and answer blocks come in order and the graph parses (stage viskg_rl)."""
    return _column(task, examples, completions, 1)


@rewards.register("viskg_compactness", tasks=("viskg",))
def viskg_compactness(task, examples, completions: Sequence[str], finished) -> Tensor:
    """VisKG's r_kg: 1 - min(1, graph tokens / T_budget) when the graph parses, else 0 (stage viskg_rl)."""
    return _column(task, examples, completions, 2)
