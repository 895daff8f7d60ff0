"""Multi-turn sampling: the policy and an environment take turns; the transcript is one completion.

The rollout engine (rollout/decode.py) samples the policy's tokens; after each one the environment reads it as an
action (its decoded text) and its observation is fed through the same KV cache as tokens the policy did not produce,
so a turn costs its new tokens only. The result is a `Samples` like single-turn sampling gives, with
`completion_mask` 1 on action tokens only, so observation tokens never enter the loss, the log-probs or the decoded
text the rewards read, and `attention_mask` 1 on every real token, so every later forward pass reads the episode as
the policy saw it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from posttrain.envs.base import Env
from posttrain.rollout.decode import Samples, sample


class _Episodes:
    """One env per engine row, as the engine's `Environment`: a token becomes the action text, the observation
    becomes tokens."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, envs: Sequence[Env]):
        self.tokenizer, self.envs = tokenizer, envs

    def respond(self, row: int, token: int) -> tuple[list[int], bool]:
        step = self.envs[row].step(self.tokenizer.decode([token]))
        return self.tokenizer(step.observation, add_special_tokens=False).input_ids, step.done


@torch.no_grad()
def multi_turn_sample(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, envs: list[Env], first_observations: list[str], max_tokens: int,
    temperature: float = 1.0, generator: torch.Generator | None = None, greedy: bool = False,
) -> Samples:
    """Run one episode per env (already reset; `first_observations` are what reset returned, the prompts)
    until every episode is done or has used `max_tokens` completion tokens (actions + observations); `greedy`
    takes the most likely action token at every turn."""
    device = next(model.parameters()).device
    prompts = [tokenizer(text, add_special_tokens=False).input_ids for text in first_observations]
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), tokenizer.pad_token_id, dtype=torch.long, device=device)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):  # left padding, as everywhere
        ids[row, width - len(prompt):] = torch.tensor(prompt, device=device)
        mask[row, width - len(prompt):] = 1
    return sample(
        model, ids, mask, group_size=1, max_new_tokens=max_tokens, eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id,
        temperature=temperature, greedy=greedy, generator=generator, env=_Episodes(tokenizer, envs),
    )


def env_sampler(tokenizer: PreTrainedTokenizerBase, make_env: Callable[[str], Env]):
    """A drop-in for `rollout.sampling.sample`: G episodes per prompt row, each env built from the prompt text."""

    def sample(model, prompt_ids: Tensor, prompt_mask: Tensor, *, group_size: int, max_new_tokens: int, eos_id: int, pad_id: int,
               temperature: float = 1.0, greedy: bool = False, generator: torch.Generator | None = None) -> Samples:
        texts = tokenizer.batch_decode(prompt_ids.masked_fill(prompt_mask == 0, pad_id).cpu(), skip_special_tokens=True)
        envs = [make_env(text) for text in texts for _ in range(group_size)]
        first = [env.reset() for env in envs]
        return multi_turn_sample(model, tokenizer, envs, first, max_new_tokens, temperature, generator, greedy)

    return sample
