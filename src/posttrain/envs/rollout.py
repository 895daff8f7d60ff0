"""Multi-turn sampling: the policy and an environment take turns; the transcript is one completion.

Each turn the policy samples one action token after everything so far (prompt, its earlier actions, the
environment's observations); the environment's observation is then appended as tokens the policy did not
produce. The result is a `Samples` like single-turn sampling gives, with `completion_mask` 1 on action tokens
only, so observation tokens never enter the loss, the log-probs or the decoded text the rewards read, and
`attention_mask` 1 on every real token, so every later forward pass reads the episode as the policy saw it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from posttrain.envs.base import Env
from posttrain.models.decoders import positions_from_mask
from posttrain.models.sampling import Samples, categorical


@torch.no_grad()
def multi_turn_sample(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, envs: list[Env], first_observations: list[str], max_tokens: int,
    temperature: float = 1.0, generator: torch.Generator | None = None, greedy: bool = False,
) -> Samples:
    """Run one episode per env (already reset; `first_observations` are what reset returned, the prompts)
    until every episode is done or has used `max_tokens` completion tokens (actions + observations); `greedy`
    takes the most likely action token at every turn."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    prompts = [tokenizer(text, add_special_tokens=False).input_ids for text in first_observations]
    ids: list[list[int]] = [[] for _ in envs]
    acted: list[list[int]] = [[] for _ in envs]  # 1 on tokens the policy produced
    logps: list[list[float]] = [[] for _ in envs]
    done = [False] * len(envs)
    finished = [False] * len(envs)
    while not all(done):
        live = [i for i, d in enumerate(done) if not d]
        rows = [prompts[i] + ids[i] for i in live]
        width = max(map(len, rows))
        batch = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long, device=device)
        mask = torch.zeros_like(batch)
        for r, row in enumerate(rows):  # left padding, as everywhere
            batch[r, width - len(row):] = torch.tensor(row, device=device)
            mask[r, width - len(row):] = 1
        logits = model(input_ids=batch, attention_mask=mask, position_ids=positions_from_mask(mask), logits_to_keep=1).logits[:, -1].float()
        logp_all = torch.log_softmax(logits / temperature, dim=-1)
        tokens = logp_all.argmax(-1) if greedy else categorical(logp_all, generator)
        for r, i in enumerate(live):
            token = int(tokens[r])
            ids[i].append(token)
            acted[i].append(1)
            logps[i].append(float(logp_all[r, token]))
            if token == tokenizer.eos_token_id:
                done[i], finished[i] = True, True
                continue
            step = envs[i].step(tokenizer.decode([token]))
            observation = tokenizer(step.observation, add_special_tokens=False).input_ids
            ids[i] += observation
            acted[i] += [0] * len(observation)
            logps[i] += [0.0] * len(observation)
            if step.done:
                done[i], finished[i] = True, True
            if len(ids[i]) >= max_tokens:
                done[i] = True
    model.train(was_training)
    width = max(map(len, ids))
    out_ids = torch.full((len(envs), width), tokenizer.pad_token_id, dtype=torch.long, device=device)
    out_mask = torch.zeros_like(out_ids)
    out_attention = torch.zeros_like(out_ids)
    out_logp = torch.zeros(len(envs), width, device=device)
    for i in range(len(envs)):
        n = len(ids[i])
        out_ids[i, :n] = torch.tensor(ids[i], device=device)
        out_mask[i, :n] = torch.tensor(acted[i], device=device)
        out_attention[i, :n] = 1
        out_logp[i, :n] = torch.tensor(logps[i], device=device)
    return Samples(out_ids, out_mask, out_logp, torch.tensor(finished, device=device), out_attention)


def env_sampler(tokenizer: PreTrainedTokenizerBase, make_env: Callable[[str], Env]):
    """A drop-in for `rollout.engine.sample`: G episodes per prompt row, each env built from the prompt text."""

    def sample(model, prompt_ids: Tensor, prompt_mask: Tensor, *, group_size: int, max_new_tokens: int, eos_id: int, pad_id: int,
               temperature: float = 1.0, greedy: bool = False, generator: torch.Generator | None = None) -> Samples:
        texts = tokenizer.batch_decode(prompt_ids.masked_fill(prompt_mask == 0, pad_id).cpu(), skip_special_tokens=True)
        envs = [make_env(text) for text in texts for _ in range(group_size)]
        first = [env.reset() for env in envs]
        return multi_turn_sample(model, tokenizer, envs, first, max_new_tokens, temperature, generator, greedy)

    return sample
