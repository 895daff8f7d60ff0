"""Critics: a value head on a language-model backbone, V(s_t) for every completion token.

A critic is a `*ForSequenceClassification` model with one label (the shape the `bt` reward model has): its
backbone reads `prompt + completion` with the completion's attention mask (environment observations attended)
and its linear `score` head maps each position's last hidden state to a scalar. V(s_t), the value of the state
before completion token y_t, is read at the position that predicts y_t (as the log-probs are), so the values
[B, T] line up with `completion_mask`.

- `critic_from_policy(policy)`: a copy of the policy's backbone with a fresh, zero head (V = 0 to start);
- `load_critic(path)`: a saved critic, or any causal-LM checkpoint (its backbone, a fresh zero head);
- `save_critic(critic, out)`: a `from_pretrained`-loadable directory.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from torch import Tensor
from transformers import AutoModelForSequenceClassification, PreTrainedModel

from posttrain.errors import UserError
from posttrain.models.decoders import positions_from_mask
from posttrain.storage import MODEL, model_dir

HEAD_FILE = "critic.json"  # written next to a saved critic: it has a trained head


def _zero_head(critic: PreTrainedModel) -> PreTrainedModel:
    with torch.no_grad():
        critic.score.weight.zero_()
        if getattr(critic.score, "bias", None) is not None:
            critic.score.bias.zero_()
    return critic


def critic_from_policy(policy: PreTrainedModel) -> PreTrainedModel:
    """A value model whose backbone is a copy of `policy`'s (LoRA adapters as they are: zero at the start) and
    whose head is zero, on the policy's device and dtype."""
    from transformers.utils import logging as hf_logging

    base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
    parameter = next(base.parameters())
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        config = copy.deepcopy(base.config)
        config.num_labels = 1
        critic = AutoModelForSequenceClassification.from_config(config)
    finally:
        hf_logging.set_verbosity(level)
    critic.base_model.load_state_dict(base.base_model.state_dict())
    return _zero_head(critic).to(device=parameter.device, dtype=parameter.dtype)


def critic_dir(path: str | Path) -> Path:
    """The model directory `path` names: itself, or its `model/` (the `critic` stage's output); UserError if neither."""
    found = model_dir(Path(path))
    if not (found / "config.json").is_file():
        raise UserError(f"rl.critic.path: no model directory (config.json) at {path} or {Path(path) / MODEL}")
    return found


def load_critic(path: str | Path, device, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """The critic saved at `path` (save_critic; or the `critic` stage's output holding model/), or a fresh zero head
    on the backbone of the causal LM there."""
    from transformers.utils import logging as hf_logging

    local = critic_dir(path)
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        critic = AutoModelForSequenceClassification.from_pretrained(local, num_labels=1, dtype=dtype)
    finally:
        hf_logging.set_verbosity(level)
    if not (local / HEAD_FILE).is_file():
        _zero_head(critic)
    return critic.to(device)


def save_critic(critic: PreTrainedModel, out: Path) -> None:
    critic.save_pretrained(out)
    (out / HEAD_FILE).write_text('{"head": "trained"}\n')


def state_values(critic: PreTrainedModel, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """[B, T + 1] V(s_t) for t = 0..T: s_t is the prompt and the first t completion tokens (float32; with gradient
    when the caller has it on). A row of L real tokens ends in state s_L (`final_values`); later columns are padding."""
    ids = torch.cat([prompt_ids, completion_ids], dim=1)
    mask = torch.cat([prompt_mask, attention_mask.to(prompt_mask.dtype)], dim=1)
    hidden = critic.base_model(input_ids=ids, attention_mask=mask, position_ids=positions_from_mask(mask)).last_hidden_state
    return critic.score(hidden[:, prompt_ids.shape[1] - 1 :]).squeeze(-1).float()


def token_values(critic: PreTrainedModel, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """[B, T] V(s_t) before each completion token y_t (the value of the state the policy acted in)."""
    return state_values(critic, prompt_ids, prompt_mask, completion_ids, attention_mask)[:, :-1]


def final_values(values: Tensor, attention_mask: Tensor) -> Tensor:
    """[B] V(s_L) of each row's last state, from `state_values` [B, T + 1] (L = the row's real completion tokens)."""
    lengths = attention_mask.sum(-1).long()
    return values.gather(1, lengths[:, None]).squeeze(1)
