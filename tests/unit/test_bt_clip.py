"""`rl.options.bt.clip`: the Bradley-Terry reward clamped to the range its model gave the held-out pairs."""

from __future__ import annotations

import json

import torch
from transformers import AutoModelForSequenceClassification, Qwen2Config

from posttrain.models import train_char_tokenizer
from posttrain.rewards.bradley_terry import POOLING_FILE, bt_reward
from posttrain.tasks import Example


class _RL:
    def __init__(self, path, clip):
        self.path, self.clip = path, clip

    def options_for(self, name):
        return self


def test_clip_bounds_the_reward_by_the_heldout_range(tmp_path):
    tokenizer = train_char_tokenizer(["0123456789+="])
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, max_position_embeddings=32, pad_token_id=tokenizer.pad_token_id, num_labels=1)
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(config)
    model.score.weight.data.normal_(0, 10.0)  # spread the scores well beyond the range below
    (tmp_path / "model").mkdir()
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    (tmp_path / "model" / POOLING_FILE).write_text(json.dumps({"pooling": "last", "range": [-0.5, 0.25]}))
    examples = [Example("12+30=", "42", "42")] * 6
    texts = ["42", "4", "9", "99", "0", "41"]
    raw = bt_reward(None, examples, texts, [True] * 6, rl=_RL(str(tmp_path), False))
    clipped = bt_reward(None, examples, texts, [True] * 6, rl=_RL(str(tmp_path), True))
    assert raw.min() < -0.5 or raw.max() > 0.25  # the clamp has something to do
    assert torch.equal(clipped, raw.clamp(-0.5, 0.25)) and clipped.min() >= -0.5 and clipped.max() <= 0.25
