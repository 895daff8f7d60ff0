"""`reward_model.options.bt.sft_weight`: the Bradley-Terry loss plus the SFT model's next-token loss on the
chosen answers, read through the reward model's own backbone (hidden-state regularisation)."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, Qwen2Config

from helpers import REPO
from posttrain import resolve
from posttrain.data.preferences import PreferencePair
from posttrain.models import train_char_tokenizer
from posttrain.rewards.bradley_terry import POOLING_FILE, encode_texts, hidden_states
from posttrain.trainers.reward_model import chosen_nll, language_head, train_bt


def _checkpoint(path, tied: bool):
    tokenizer = train_char_tokenizer(["0123456789+="])
    cfg = Qwen2Config(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, max_position_embeddings=32, pad_token_id=tokenizer.pad_token_id,
                      tie_word_embeddings=tied)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return model.eval(), tokenizer


@pytest.mark.parametrize("tied", [True, False])
def test_the_auxiliary_head_is_the_sft_models_language_model(tmp_path, tied):
    causal, tokenizer = _checkpoint(tmp_path, tied)
    rm = AutoModelForSequenceClassification.from_pretrained(tmp_path, num_labels=1).eval()
    prompts, answers = ["12+30=", "7+5="], ["42", "12"]
    ids, mask, response = encode_texts(tokenizer, prompts, answers, "cpu")
    with torch.no_grad():
        ours = chosen_nll(language_head(rm, tmp_path, "cpu"), hidden_states(rm, ids, mask), ids, response)
        labels = torch.where(response.bool(), ids, -100)  # the causal LM's own loss on answer + EOS only
        position_ids = (mask.cumsum(-1) - 1).clamp_min(0)
        theirs = causal(input_ids=ids, attention_mask=mask, position_ids=position_ids, labels=labels).loss
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def _cfg(tmp_path, sft_weight: float):
    return resolve.load(REPO / "params.yaml", [
        "pipeline.device=cpu", "reward_model.steps=4", "reward_model.batch_size=4", "reward_model.log_every=2",
        "reward_model.warmup_steps=0", "reward_model.options.bt.pooling=last", f"reward_model.options.bt.sft_weight={sft_weight}",
    ])


@pytest.mark.parametrize("tied", [True, False])
def test_training_with_sft_weight_saves_a_plain_reward_model(tmp_path, tied):
    _checkpoint(tmp_path / "sft", tied)
    pairs = [PreferencePair(f"{a}+{b}=", str(a + b), str(a + b + 1), 1 / 3, None) for a in range(5) for b in range(4)]
    logged = []
    metrics = train_bt(_cfg(tmp_path, 1.0), tmp_path / "sft", pairs[:16], pairs[16:], tmp_path / "rm", 0, lambda s, m: logged.append(m))
    assert 0.0 <= metrics["heldout_pair_accuracy"] <= 1.0
    assert all(m["rm_total_loss"] > m["rm_loss"] for m in logged)  # the NLL term is in the optimised loss, not in the BT figure
    saved = AutoModelForSequenceClassification.from_pretrained(tmp_path / "rm" / "model")
    assert not any("lm_head" in name for name, _ in saved.named_parameters())  # the auxiliary head is not part of the reward model
    assert json.loads((tmp_path / "rm" / "model" / POOLING_FILE).read_text())["pooling"] == "last"


def test_zero_sft_weight_is_plain_bradley_terry(tmp_path):
    _checkpoint(tmp_path / "sft", True)
    pairs = [PreferencePair(f"{a}+{b}=", str(a + b), str(a + b + 1), 1 / 3, None) for a in range(5) for b in range(4)]
    logged = []
    train_bt(_cfg(tmp_path, 0.0), tmp_path / "sft", pairs[:16], pairs[16:], tmp_path / "rm", 0, lambda s, m: logged.append(m))
    assert logged and all(m["rm_total_loss"] == m["rm_loss"] for m in logged)
