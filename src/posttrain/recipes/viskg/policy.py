"""VisKG on the core RL step (trainers/online_rl.py's `OnlineRL.step`): its vision-language model as a `Policy`
(rollout/policy.py), its questions as the run's task, and its rewards as registered reward functions.

- `VisionLanguagePolicy`: a question's image rides on its example (`metadata["image"]`, uint8 [S, S, 3]); `encode`
  gives the model's prompt ids and the images as the prompts' `inputs`, which the trainer copies onto each sample
  (`batch.extras["images"]`), so the completion log-probs of any micro-batch or kept group read their own images.
  Sampling is the rollout engine's (the model's `sample`), its log-probs recorded as old_logp.
- `VisKGTask`: what the rewards read besides the text (the representation's tag, the graph budget T_budget, the
  policy's token counter) and the verifier of the run's `accuracy` figure.
- the rewards `viskg_accuracy`, `viskg_format`, `viskg_compactness` (registered in recipes/viskg/rewards.py: r_acc,
  r_fmt, r_kg, read through the task) make the reward matrix [B, 3]; the estimator (`viskg.rl.advantage`: GDPO normalises each column in its group, GRPO
  their weighted sum) sees them with viskg.rl.weights.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from posttrain.recipes.viskg.rewards import reward_row
from posttrain.recipes.viskg.vlm import VisionLanguage
from posttrain.rollout import PolicyOutputs, RolloutBatch
from posttrain.rollout.policy import Prompts
from posttrain.rollout.sampling import Samples, StopStrings
from posttrain.tasks import Example

IMAGES = "images"  # the batch extra holding each sample's image


def decode(tokenizer, ids: Tensor, mask: Tensor) -> list[str]:
    """Each completion's text without EOS, special tags kept (the output's <kg>, <think>, <answer> blocks)."""
    eos = tokenizer.eos_token_id
    return [tokenizer.decode([t for t in row[m.bool()].tolist() if t != eos], skip_special_tokens=False) for row, m in zip(ids, mask)]


class VisionLanguagePolicy:
    """A `VisionLanguage` model as the `Policy` of an RL run (see the module docstring)."""

    log_probs_only = True

    def __init__(self, vlm: VisionLanguage):
        self.model, self.tokenizer = vlm, vlm.tokenizer

    def over(self, model: VisionLanguage) -> VisionLanguagePolicy:
        return VisionLanguagePolicy(model)

    def encode(self, prompts: Sequence[Example], device: torch.device) -> Prompts:
        images = torch.stack([e.metadata["image"] for e in prompts])
        ids, mask = self.model.encode_prompts([e.prompt for e in prompts], images)
        return Prompts(ids.to(device), mask.to(device), {IMAGES: images})

    def generate(self, prompts: Prompts, *, group_size: int, max_new_tokens: int, temperature: float,
                 generator: torch.Generator, stop: StopStrings | None) -> Samples:
        rows = lambda t: t.repeat_interleave(group_size, 0)  # noqa: E731  (prompt-major: prompt i's samples are rows i*G ..)
        return self.model.sample(rows(prompts.inputs[IMAGES]), rows(prompts.ids), rows(prompts.mask), max_new_tokens, temperature, generator)

    def decode(self, samples: Samples, stop: StopStrings | None) -> list[str]:
        return decode(self.tokenizer, samples.completion_ids, samples.completion_mask)

    def forward(self, batch: RolloutBatch, temperature: float, *, full: bool = False, hidden: bool = False,
                entropy: bool = False) -> PolicyOutputs:
        return PolicyOutputs(logp=self.model.completion_logp(batch.extras[IMAGES], batch.prompt_ids, batch.prompt_mask,
                                                             batch.completion_ids, batch.completion_mask, temperature))


class VisKGTask:
    """The VisKG questions as an RL run's task: the settings its rewards read, and its verifier (the `accuracy` figure)."""

    def __init__(self, representation: str, kg_budget: int, count_tokens: Callable[[str], int]):
        self.representation, self.kg_budget, self.count_tokens = representation, kg_budget, count_tokens

    def reward_row(self, text: str, example: Example) -> tuple[float, float, float]:
        return reward_row(text, example.answer, self.representation, self.kg_budget, self.count_tokens)

    def correctness_reward(self, text: str, finished: bool, example: Example) -> float:
        return self.reward_row(text, example)[0]

