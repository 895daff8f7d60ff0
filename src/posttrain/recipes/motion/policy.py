"""MotionInsight on the core RL step (trainers/online_rl.py's `OnlineRL.step`): the evaluator as a `Policy`
(rollout/policy.py), the training videos as the run's task, and the reward's three terms as registered rewards.

- `EvaluatorPolicy`: a video's inputs ride on its example (`metadata["maps"]` [T, C, S, S], `metadata["tracks"]`
  [T, D]); `encode` gives the one prompt token and the videos as the prompts' `inputs`, which the trainer copies onto
  each sample (`batch.extras["maps"]`, `["tracks"]`). `over(reference)` reads the frozen SFT evaluator the same way,
  for the k3 KL term (`motion.rl.beta`).
- `MotionTask`: each video's annotation (scores and failure causes) and the reward's weights.
- the rewards `motion_score_accuracy`, `motion_cause_f1`, `motion_format` (registered in recipes/motion/reward.py: its
  terms, read through the task) make the reward matrix [B, 3], weighted 1, w_cause, w_format.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from posttrain.recipes.motion.evaluator import MotionEvaluator
from posttrain.recipes.motion.reward import motion_reward
from posttrain.rollout import PolicyOutputs, RolloutBatch
from posttrain.rollout.policy import Prompts
from posttrain.rollout.sampling import Samples, StopStrings
from posttrain.tasks import Example

MAPS, TRACKS = "maps", "tracks"  # the batch extras holding each sample's video


class EvaluatorPolicy:
    """A `MotionEvaluator` as the `Policy` of an RL run (see the module docstring)."""

    log_probs_only = True

    def __init__(self, evaluator: MotionEvaluator):
        self.model, self.tokenizer = evaluator, evaluator.tokenizer

    def over(self, model: MotionEvaluator) -> EvaluatorPolicy:
        return EvaluatorPolicy(model)

    def encode(self, prompts: Sequence[Example], device: torch.device) -> Prompts:
        videos = {MAPS: torch.stack([e.metadata[MAPS] for e in prompts]), TRACKS: torch.stack([e.metadata[TRACKS] for e in prompts])}
        return Prompts(*self.model.prompt(len(prompts), device), videos)

    def generate(self, prompts: Prompts, *, group_size: int, max_new_tokens: int, temperature: float,
                 generator: torch.Generator, stop: StopStrings | None) -> Samples:
        rows = lambda t: t.repeat_interleave(group_size, 0)  # noqa: E731  (prompt-major: video i's samples are rows i*G ..)
        return self.model.sample(rows(prompts.inputs[MAPS]), rows(prompts.inputs[TRACKS]), max_new_tokens, temperature, generator)

    def decode(self, samples: Samples, stop: StopStrings | None) -> list[str]:
        return self.model.decode(samples.completion_ids, samples.completion_mask)

    def forward(self, batch: RolloutBatch, temperature: float, *, full: bool = False, hidden: bool = False,
                entropy: bool = False) -> PolicyOutputs:
        soft = self.model.encoder(batch.extras[MAPS], batch.extras[TRACKS])
        return PolicyOutputs(logp=self.model.completion_logp_from(soft, batch.prompt_ids, batch.prompt_mask, batch.completion_ids,
                                                                  batch.completion_mask, temperature))


class MotionTask:
    """The training videos as an RL run's task: what the reward reads besides the text (example.metadata["video"]
    indexes the annotations)."""

    def __init__(self, scores: list[dict[str, float]], causes: list[tuple[str, ...]], w_cause: float, w_format: float):
        self.scores, self.causes, self.w_cause, self.w_format = scores, causes, w_cause, w_format

    def terms(self, text: str, example: Example) -> dict[str, float]:
        i = example.metadata["video"]
        return motion_reward(text, self.scores[i], self.causes[i], self.w_cause, self.w_format)

