"""The key-room text world (envs/text_world.py) as a task: prompts are (room, start) pairs split disjointly
by start cell pattern, the reference completion is the shortest action string, and the verifier replays the
actions. Its `sampler` runs the multi-turn environment in place of single-turn sampling.
"""

from __future__ import annotations

import random

from posttrain.envs.rollout import env_sampler
from posttrain.envs.text_world import CELLS, OBSERVATION_CHARS, ROOMS, KeyRoom, goal_of, parse_prompt, replay, shortest_actions, transcript
from posttrain.errors import UserError
from posttrain.tasks import tasks
from posttrain.tasks.base import Example, Task


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

    def skill_vocabulary(self) -> list[str]:
        """PR-OPD's structured hindsight skills: `g<cell>`, "this room's goal is cell <cell>". A fact about the
        room, reusable from each of its start states, not an episode's answer (the action string)."""
        return [f"g{cell}" for cell in range(CELLS)]

    def sampler(self, tokenizer):
        """Multi-turn sampling for the RL loop (see trainers/online_rl.rollout)."""
        return env_sampler(tokenizer, KeyRoom)


def hint(example: Example) -> str:
    """The written hint that helps: the goal cell."""
    return f"g{example.answer}"
