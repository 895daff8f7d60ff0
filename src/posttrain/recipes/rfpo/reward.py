"""`rfpo`: RFPO's reward-free reward (Reward-Free Policy Optimization, 2026; derived from its abstract):
a frozen critic, pretrained with labels to predict eventual success from a prefix (the `critic` stage), scores each
rollout's last state; no verifier and no reference answer is read.

    v_i = V_psi(s_{L_i})                              the critic's value after rollout i's L_i tokens (EOS included)
    b(L) = mean of v over the batch's rollouts of length L   (`bins: null`; or over equal-width length bins)
    z_i = v_i - b(L_i)                                the length-debiased score
    R_i = 1[z_i > tau]                                (`binarize: true`; else R_i = v_i, the raw, length-biased score)

A rollout cut at the length budget (rl.max_new_tokens, the truncation length T_c) is scored by the same rule at
its last state s_{T_c}: it is rewarded early, as the complete ones are. b(L) is re-estimated on every batch, so
adding any function of length to V (per length; per bin with `bins`) leaves R unchanged. Used with the same frozen
critic as the GAE baseline (rl.advantage: gae with no `value` term; preset `rfpo`), read from `rl.critic.path`.
Settings: rl.options.rfpo (defaults on its options model below).
"""

from __future__ import annotations

from pathlib import Path

import torch
from pydantic import Field
from torch import Tensor

from posttrain.config import Section
from posttrain.rewards import rewards
from posttrain.rewards.trained import _cached


class RFPOOptions(Section):  # rl.options.rfpo
    tau: float = 0.0  # threshold on the debiased score (0: above the batch's mean at that length)
    bins: int | None = Field(None, gt=0)  # null: b(L) per exact length; else equal-width bins over 1..rl.max_new_tokens
    binarize: bool = True  # false: the raw critic score V(s_L) (the length exploit the debiasing removes)


def length_baseline(scores: Tensor, lengths: Tensor, max_len: int, bins: int | None) -> Tensor:
    """b(L_i) [N]: the mean score of the rollouts in row i's length bin (each length its own bin when `bins` is None)."""
    keys = lengths.long() if bins is None else ((lengths.clamp(1, max_len).double() - 1) * bins / max_len).floor().long()
    _, index = torch.unique(keys, return_inverse=True)
    total = torch.zeros(int(index.max()) + 1, dtype=scores.dtype).index_add_(0, index, scores)
    count = torch.zeros_like(total).index_add_(0, index, torch.ones_like(scores))
    return (total / count)[index]


def rfpo_scores(values: Tensor, lengths: Tensor, max_len: int, opts: RFPOOptions) -> Tensor:
    """R [N] from final-state values and lengths only: the one rule for truncated and complete rollouts alike."""
    if not opts.binarize:
        return values
    z = values - length_baseline(values, lengths, max_len, opts.bins)
    return (z > opts.tau).to(values.dtype)


def _build(path: str):
    from posttrain.models import load_tokenizer, select_device
    from posttrain.models.value import load_critic

    return load_critic(path, select_device("auto")).eval().requires_grad_(False), load_tokenizer(path)


@torch.no_grad()
def final_state_values(critic, tokenizer, examples, completion_ids: Tensor, attention: Tensor) -> Tensor:
    """[N] V(s_L) of the sampled token ids (pad after EOS, `attention` 1 on every real token) after the prompts encoded
    as the rollouts were (chat template): the states the critic stage regressed, and the GAE baseline reads. Decoding
    and re-encoding the text instead would drop any special token the policy produced mid-completion (padding, BOS),
    and score a state the critic never saw."""
    from posttrain.rollout.sampling import encode_prompts
    from posttrain.models.value import final_values, state_values

    device = next(critic.parameters()).device
    prompt_ids, prompt_mask = encode_prompts(tokenizer, list(examples), device)
    ids, mask = completion_ids.to(device), attention.to(device)
    return final_values(state_values(critic, prompt_ids, prompt_mask, ids, mask), mask).cpu().clamp(0.0, 1.0)


@rewards.register("rfpo", needs=("rl", "lengths", "max_len", "completion_ids", "completion_attention"), options=RFPOOptions)
def rfpo_reward(task, examples, completions, finished, *, rl, lengths, max_len, completion_ids, completion_attention) -> Tensor:
    """RFPO's binarised, length-debiased score of the frozen critic (rl.critic.path) on the sampled token ids; reads no
    answer and no verifier (the texts are not read)."""
    from posttrain.errors import UserError
    from posttrain.models.value import critic_dir

    if rl.critic.path is None:
        raise UserError("rl.rewards: rfpo needs a pretrained critic: set rl.critic.path (the `critic` stage's output)")
    path = critic_dir(rl.critic.path)
    critic, tokenizer = _cached(_build, str(Path(path).resolve()), (Path(path) / "config.json").stat().st_mtime)
    values = final_state_values(critic, tokenizer, examples, completion_ids, completion_attention)
    return rfpo_scores(values, torch.as_tensor(lengths), max_len, rl.options_for("rfpo"))
