"""Key-room corridor: a small goal-reaching text world where a written hint helps.

Each of 16 rooms (a..p) is a corridor of 5 cells; the room's goal cell is fixed but not shown. The prompt
is the room and the start cell, e.g. `c1>`. Actions are one character: `l` / `r` move, `s` stops (success
iff on the goal). After a move the environment answers the new cell, e.g. `2>`. An episode ends on `s`,
on any other character, or when the token budget is used. A hint `g<cell>` in context (what a hindsight
skill should say) names the goal, so an agent that reads it can walk straight there; without it the agent
has to learn each room's goal from reward.

The world is offered to the RL loop as the task `text_world` (tasks/text_world.py).
"""

from __future__ import annotations

from posttrain.envs.base import Env, Step

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
