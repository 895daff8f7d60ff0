"""Key-room corridor: a small goal-reaching text world where a written hint helps.

Each of 16 rooms (a..p) is a corridor of 5 cells; the room's goal cell is fixed but not shown. The prompt
is the room and the start cell, e.g. `c1>`. Actions are one character: `l` / `r` move, `s` stops (success
iff on the goal). After a move the environment answers the new cell, e.g. `2>`. An episode ends on `s`,
on any other character, or when the token budget is used. A hint `g<cell>` in context (what a hindsight
skill should say) names the goal, so an agent that reads it can walk straight there; without it the agent
has to learn each room's goal from reward.

As a task (registered as `text_world`), prompts are (room, start) pairs split disjointly by start cell
pattern, the reference completion is the shortest action string, and the verifier replays the actions.
"""

from __future__ import annotations

import random

from posttrain.envs.base import Env, Step
from posttrain.envs.rollout import env_sampler
from posttrain.errors import UserError
from posttrain.tasks import tasks
from posttrain.tasks.base import Example, Task

ROOMS = "abcdefghijklmnop"
CELLS = 5
OBSERVATION_CHARS = "0123456789>"  # what the environment writes; as actions they are no-ops (see replay)


def goal_of(room: str) -> int:
    """The room's hidden goal cell (fixed: the same world for every seed)."""
    return (ROOMS.index(room) * 3 + 1) % CELLS


def parse_prompt(prompt: str) -> tuple[str, int]:
    room, cell = prompt.strip()[-3], prompt.strip()[-2]
    return room, int(cell)


def shortest_actions(start: int, goal: int) -> str:
    return ("r" if goal > start else "l") * abs(goal - start) + "s"


def replay(room: str, start: int, actions: str) -> bool:
    """True when the actions stop on the room's goal (moves clamp at the corridor's ends). Observation
    characters are skipped, so a reference transcript and a decoded action string replay the same."""
    pos = start
    for action in actions:
        if action in OBSERVATION_CHARS:
            continue
        if action == "s":
            return pos == goal_of(room)
        if action not in "lr":
            return False
        pos = min(max(pos + (1 if action == "r" else -1), 0), CELLS - 1)
    return False


class KeyRoom(Env):
    def __init__(self, prompt: str):
        self.room, self.start = parse_prompt(prompt)
        self.prompt = prompt

    def reset(self) -> str:
        self.pos = self.start
        return self.prompt

    def step(self, action: str) -> Step:
        if action in OBSERVATION_CHARS:  # a no-op, as in `replay`
            return Step("", 0.0, False)
        if action == "s":
            return Step("", float(self.pos == goal_of(self.room)), True)
        if action not in ("l", "r"):
            return Step("", 0.0, True)
        self.pos = min(max(self.pos + (1 if action == "r" else -1), 0), CELLS - 1)
        return Step(f"{self.pos}>", 0.0, False)


def transcript(start: int, actions: str) -> str:
    """The full completion text (actions and observations) of an action string."""
    out, pos = "", start
    for action in actions:
        out += action
        if action in "lr":
            pos = min(max(pos + (1 if action == "r" else -1), 0), CELLS - 1)
            out += f"{pos}>"
    return out


@tasks.register("text_world")
class TextWorld(Task):
    def splits(self, seed: int) -> dict[str, list[Example]]:
        pairs = [(room, start) for room in ROOMS for start in range(CELLS)]
        wanted = self.cfg.n_train + self.cfg.n_heldout
        if wanted > len(pairs):
            raise UserError(f"task.n_train + task.n_heldout = {wanted} exceeds the {len(pairs)} text_world start states")
        random.Random(seed).shuffle(pairs)
        examples = [self.example(room, start) for room, start in pairs[:wanted]]
        return {"train": examples[: self.cfg.n_train], "heldout": examples[self.cfg.n_train :]}

    def example(self, room: str, start: int) -> Example:
        actions = shortest_actions(start, goal_of(room))
        return Example(prompt=f"{room}{start}>", completion=transcript(start, actions), answer=str(goal_of(room)))

    def parse(self, completion: str) -> str | None:
        """The action string (observations are not in the decoded text) if it ends with a stop."""
        return completion if completion.endswith("s") and set(completion) <= set("lrs" + OBSERVATION_CHARS) else None

    def correctness_reward(self, completion: str, finished: bool, example: Example) -> float:
        room, start = parse_prompt(example.prompt)
        return float(replay(room, start, completion))

    def alphabet(self) -> str:
        return ROOMS + "0123456789lrsg>=-"

    def sampler(self, tokenizer):
        """Multi-turn sampling for the RL loop (see trainers/online_rl.rollout)."""
        return env_sampler(tokenizer, KeyRoom)


def hint(example: Example) -> str:
    """The written hint that helps: the goal cell."""
    return f"g{example.answer}"
