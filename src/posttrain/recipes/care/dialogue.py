"""A multi-turn, dialogue-like support task whose ideal rubric changes with the turn (for CARE, "Context-Adaptive Rubric Evolution", 2026).

A dialogue is a history of user turns, each a user state and a topic, with the assistant's earlier replies;
the policy writes the reply to the last user turn as a string of support moves:

    prompt      "xj>vq|wf>"      turn 1: state x, topic j, reply "vq";  turn 2 (now): state w, topic f
    completion  "vvss"           1 to 4 moves, ended by EOS

    moves       q cognitive (ask, reflect)   v affective (validate, empathise)   s proactive (suggest a step)
    states      x distressed, o confused, h hopeful, w worried;   topics j f m u (distractors)

Per-dimension judges (programmatic, known truth): s_d = min(moves of dimension d in the reply, 2) / 2, in
[0, 1]; a malformed or unfinished reply scores 0 on every dimension. The ideal weighting w*(state, turn) is a
fixed table (`IDEAL_TENTHS`) that moves with the turn (e.g. worried: affective + cognitive first, proactive by
turn 3), and the true quality of a reply is Q* = sum_d w*_d s_d. Four moves cover at most two dimensions
fully, so the best reply covers the two heaviest dimensions of w* (unique in every context of the table),
and under uniform weights every reply covering two dimensions ties: a fixed rubric cannot tell which two.
`correctness` = the reply reaches the context's best Q*; the reference completion is such a reply.
"""

from __future__ import annotations

import random
import re

from posttrain.errors import UserError
from posttrain.tasks import tasks
from posttrain.tasks.base import Example, Task

DIMENSION_MOVES = ("q", "v", "s")  # the move of each dimension: cognitive, affective, proactive
MOVES = "".join(DIMENSION_MOVES)
STATES, TOPICS = "xohw", "jfmu"
ALPHABET = STATES + TOPICS + MOVES + ">|"
MAX_MOVES, MAX_TURNS = 4, 3
_REPLY = re.compile(rf"[{MOVES}]{{1,{MAX_MOVES}}}")
_TURN = re.compile(rf"([{STATES}])([{TOPICS}])>([{MOVES}]*)")
# w*(state, turn) in tenths (cognitive, affective, proactive), turns 1..3; every row has a unique top two
IDEAL_TENTHS = {
    "x": ((2, 7, 1), (1, 6, 3), (1, 4, 5)),
    "o": ((6, 3, 1), (6, 1, 3), (4, 1, 5)),
    "h": ((3, 1, 6), (2, 1, 7), (1, 2, 7)),
    "w": ((3, 6, 1), (2, 5, 3), (3, 2, 5)),
}


def parse_context(prompt: str) -> list[tuple[str, str, str]]:
    """[(state, topic, assistant reply)] per turn; the last turn's reply is empty. UserError if malformed."""
    turns = prompt.split("|")
    parsed = [_TURN.fullmatch(t) for t in turns]
    if not prompt or any(m is None for m in parsed) or parsed[-1].group(3) or not 1 <= len(turns) <= MAX_TURNS:
        raise UserError(f"not a dialogue context: {prompt!r}")
    return [m.groups() for m in parsed]


def ideal_weights(prompt: str) -> tuple[float, float, float]:
    """w* of the current turn: the table row of the last user state at this turn number."""
    turns = parse_context(prompt)
    return tuple(t / 10 for t in IDEAL_TENTHS[turns[-1][0]][len(turns) - 1])


def judge_scores(reply: str, finished: bool = True) -> tuple[float, float, float]:
    """(s_cog, s_aff, s_pro): min(moves of each dimension, 2) / 2; 0 for a malformed or unfinished reply."""
    if not finished or not _REPLY.fullmatch(reply):
        return (0.0, 0.0, 0.0)
    return tuple(min(sum(reply.count(m) for m in moves), 2) / 2 for moves in DIMENSION_MOVES)


def true_quality(prompt: str, reply: str, finished: bool = True) -> float:
    return sum(w * s for w, s in zip(ideal_weights(prompt), judge_scores(reply, finished)))


def best_quality(prompt: str) -> float:
    """The most Q* a reply can reach: both moves of the two heaviest dimensions."""
    return sum(sorted(ideal_weights(prompt))[1:])


def best_reply(prompt: str) -> str:
    order = sorted(range(3), key=lambda d: -ideal_weights(prompt)[d])
    return 2 * DIMENSION_MOVES[order[0]] + 2 * DIMENSION_MOVES[order[1]]


def random_reply(rng: random.Random) -> str:
    """1 to MAX_MOVES random moves."""
    return "".join(rng.choice(MOVES) for _ in range(rng.randint(1, MAX_MOVES)))


def random_context(rng: random.Random) -> str:
    turns = rng.randint(1, MAX_TURNS)
    past = [f"{rng.choice(STATES)}{rng.choice(TOPICS)}>{random_reply(rng)}" for _ in range(turns - 1)]
    return "|".join([*past, f"{rng.choice(STATES)}{rng.choice(TOPICS)}>"])


def distinct_contexts(n: int, seed: int) -> list[str]:
    rng, seen = random.Random(seed), dict()
    for _ in range(50 * n):
        seen[random_context(rng)] = None
        if len(seen) == n:
            return list(seen)
    raise UserError(f"could not draw {n} distinct dialogue contexts")


@tasks.register("dialogue")
class Dialogue(Task):
    def splits(self, seed: int) -> dict[str, list[Example]]:
        prompts = distinct_contexts(self.cfg.n_train + self.cfg.n_heldout, seed)
        examples = [Example(p, best_reply(p), f"{parse_context(p)[-1][0]}{len(parse_context(p))}") for p in prompts]
        return {"train": examples[: self.cfg.n_train], "heldout": examples[self.cfg.n_train :]}

    def parse(self, completion: str) -> str | None:
        return completion if _REPLY.fullmatch(completion) else None

    def correctness_reward(self, completion: str, finished: bool, example: Example) -> float:
        """1.0 when the reply reaches the best true quality of its context."""
        return float(true_quality(example.prompt, completion, finished) >= best_quality(example.prompt) - 1e-9)

    def sample_metrics(self, completion: str, example: Example) -> dict[str, float]:
        quality = true_quality(example.prompt, completion)
        return {"true_quality": quality, "quality_regret": best_quality(example.prompt) - quality}

    def alphabet(self) -> str:
        return ALPHABET
