"""`bt`: a Bradley-Terry scalar reward model (Bradley & Terry 1952; the RLHF reward model of Ouyang et al.
2022, "Training language models to follow instructions with human feedback", arXiv 2203.02155, eq. 1) as an RL reward.

A value head on the language model reads the hidden states of `prompt + response + EOS` and returns a scalar
r(x, y) (the prompt encoded as the policy reads it, models/chat.py: through the chat template when the tokenizer has
one, with `model.system_prompt`; that format is saved with the weights so RL scores prompts the way the model was
trained on them) (`reward_model.options.bt.pooling`: the value at the last token, or summed over the response tokens); the
`reward_model` stage trains it on preference pairs (trainers/reward_model.py) and saves it with how it pools and the
range it gave the held-out pairs.

As an RL reward (`rl.rewards: [{name: bt}]`) it scores each completion with r(x, y); only differences within a
group matter to group-normalised estimators. With `clip`, r is clamped to the range the model gave the held-out
pairs (lowest candidate to highest preferred answer, saved with the weights): a completion the model scores above
every real preferred answer earns no more than the best of them, which takes away the payoff of out-of-distribution
outputs a learned reward over-rates (reward hacking).
Settings: rl.options.bt.path, the `reward_model` stage's output directory, or a plain sequence-classification
checkpoint with one label (a published reward model's `save_pretrained` directory: read with `last` pooling and the
prompt format's defaults, and no held-out range, so no `clip`); rl.options.bt.clip.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from posttrain.config import Section
from posttrain.errors import UserError
from posttrain.models.chat import Prompted, PromptFormat, configure_prompts, prompt_ids
from posttrain.models.decoders import positions_from_mask
from posttrain.rewards import rewards
from posttrain.rewards.trained import load_trained

SCORE_CHUNK = 512
POOLING_FILE = "bt_pooling.json"  # saved next to the weights: how the reward reads r(x, y), and its held-out range


class BTOptions(Section):  # rl.options.bt
    path: str = "outputs/reward_model"  # the reward_model stage's output directory (holding model/)
    clip: bool = False  # clamp r(x, y) to its range on the held-out pairs


def encode_texts(tokenizer, prompts: Sequence[str | Prompted], responses: Sequence[str], device) -> tuple[Tensor, Tensor, Tensor]:
    """Left-padded ids, attention mask and response mask (response tokens + EOS) of `prompt + response + EOS`:
    the prompt as the policy reads it (`prompt_ids`: the tokenizer's prompt format, its chat template and system
    turn), the response as the assistant's turn (EOS is the template's end of turn). An unfinished response is
    judged as the text it is, the way pairs present it in training."""
    heads = prompt_ids(tokenizer, prompts)
    tails = [tokenizer.encode(r, add_special_tokens=False) + [tokenizer.eos_token_id] for r in responses]
    width = max(len(h) + len(t) for h, t in zip(heads, tails))
    ids = torch.full((len(heads), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(heads), width), dtype=torch.long)
    response = torch.zeros((len(heads), width), dtype=torch.long)
    for i, (head, tail) in enumerate(zip(heads, tails)):
        ids[i, width - len(head) - len(tail) :] = torch.tensor(head + tail)
        mask[i, width - len(head) - len(tail) :] = 1
        response[i, width - len(tail) :] = 1
    return ids.to(device), mask.to(device), response.to(device)


def hidden_states(model, ids: Tensor, mask: Tensor) -> Tensor:
    """The backbone's last hidden states [N, T, H] (left padding: positions count from each row's first token)."""
    return model.base_model(input_ids=ids, attention_mask=mask, position_ids=positions_from_mask(mask)).last_hidden_state


def pool(model, hidden: Tensor, response: Tensor, pooling: str) -> Tensor:
    """r(x, y) [N]: the value head at the last token (`last`), or summed over the response tokens
    (`response_sum`: each token's value judges the text up to it, a token-level decomposition of r)."""
    values = model.score(hidden).squeeze(-1).float()
    return values[:, -1] if pooling == "last" else (values * response).sum(-1)


def scores(model, ids: Tensor, mask: Tensor, response: Tensor, pooling: str) -> Tensor:
    return pool(model, hidden_states(model, ids, mask), response, pooling)


def _build(path: str):
    from transformers import AutoModelForSequenceClassification

    from posttrain.models import load_tokenizer, select_device

    model = AutoModelForSequenceClassification.from_pretrained(path).to(select_device("auto")).eval().requires_grad_(False)
    saved = Path(path) / POOLING_FILE  # absent from a plain checkpoint: the last token's score, no held-out range
    tokenizer, settings = load_tokenizer(path), json.loads(saved.read_text()) if saved.is_file() else {"pooling": "last", "range": None}
    configure_prompts(tokenizer, PromptFormat(**settings.get("prompt_format", {})))  # as in training (older files: the defaults)
    return model, tokenizer, settings


def load_bt(directory: str):
    """(model, tokenizer, {"pooling", "range"}) under `directory/model` (cached while unchanged); UserError if absent."""
    return load_trained(directory, _build, needs=(POOLING_FILE,), plain=True, missing="rl.options.bt.path: no trained reward model at {path} "
                        "(run the reward_model stage with reward_model.kind=bt)")


@rewards.register("bt", needs=("rl",), options=BTOptions)
@torch.no_grad()
def bt_reward(task, examples, completions, finished, *, rl) -> Tensor:
    """r(x, y) of the Bradley-Terry model trained by the reward_model stage (clamped to its held-out range with clip)."""
    options = rl.options_for("bt")
    model, tokenizer, settings = load_bt(options.path)
    if options.clip and settings["range"] is None:
        raise UserError(f"rl.options.bt.clip: {options.path} is a plain checkpoint, with no held-out range to clip to "
                        "(a reward_model stage output saves one); set clip: false")
    pooling = settings["pooling"]
    device = next(model.parameters()).device
    out = []
    for s in range(0, len(completions), SCORE_CHUNK):
        ids, mask, response = encode_texts(tokenizer, examples[s : s + SCORE_CHUNK], completions[s : s + SCORE_CHUNK], device)
        out.append(scores(model, ids, mask, response, pooling).cpu())
    r = torch.cat(out)
    return r.clamp(*settings["range"]) if options.clip else r
