"""The offline character tokenizer."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from posttrain.models import train_char_tokenizer

TEXTS = ["37+48=", "85", "05-99=", "-94", "12*34=", "408", "0"]


def test_special_token_ids(char_tokenizer):
    assert (char_tokenizer.pad_token_id, char_tokenizer.eos_token_id, char_tokenizer.unk_token_id) == (0, 1, 2)
    assert char_tokenizer.pad_token == "<pad>" and char_tokenizer.eos_token == "<eos>"
    assert len(char_tokenizer) == 3 + len("0123456789-=+*")


@pytest.mark.parametrize("text", TEXTS)
def test_one_token_per_character_and_round_trip(char_tokenizer, text):
    ids = char_tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) == len(text)
    assert len(set(ids)) == len(set(text))
    assert char_tokenizer.decode(ids) == text


def test_no_special_tokens_added_by_default(char_tokenizer):
    assert char_tokenizer.encode("1+1=") == char_tokenizer.encode("1+1=", add_special_tokens=False)


def test_decode_skips_pad_and_eos(char_tokenizer):
    ids = [0, 0] + char_tokenizer.encode("85", add_special_tokens=False) + [1, 0]
    assert char_tokenizer.decode(ids, skip_special_tokens=True) == "85"


def test_unknown_character_maps_to_unk(char_tokenizer):
    assert char_tokenizer.encode("7/", add_special_tokens=False)[1] == char_tokenizer.unk_token_id


def test_left_padding(char_tokenizer):
    assert char_tokenizer.padding_side == "left"
    enc = char_tokenizer(["1+1=", "12+34="], padding=True, add_special_tokens=False)
    pad = char_tokenizer.pad_token_id
    assert enc["input_ids"][0][:2] == [pad, pad]
    assert enc["input_ids"][0][2:] == char_tokenizer.encode("1+1=", add_special_tokens=False)
    assert enc["attention_mask"] == [[0, 0, 1, 1, 1, 1], [1] * 6]


def test_deterministic_vocabulary():
    a = train_char_tokenizer(["0123456789+="]).get_vocab()
    b = train_char_tokenizer(["=+9876543210"]).get_vocab()
    assert a == b


def test_save_and_reload_with_auto_tokenizer(char_tokenizer, tmp_path):
    char_tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    for text in TEXTS:
        assert reloaded.encode(text, add_special_tokens=False) == char_tokenizer.encode(text, add_special_tokens=False)
        assert reloaded.decode(reloaded.encode(text, add_special_tokens=False)) == text
    assert reloaded.get_vocab() == char_tokenizer.get_vocab()
    assert (reloaded.pad_token_id, reloaded.eos_token_id) == (0, 1)
    assert reloaded.padding_side == "left"
    batch = ["1+1=", "12+34="]
    assert reloaded(batch, padding=True)["input_ids"] == char_tokenizer(batch, padding=True)["input_ids"]
