"""The offline character tokenizer."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from posttrain.errors import UserError
from posttrain.models import check_vocabulary, train_char_tokenizer
from posttrain.models.tokenizer import unknown_pieces, word_tokenizer

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


def test_unknown_pieces_names_each_unknown_character_once(char_tokenizer):
    assert unknown_pieces(char_tokenizer, "1x+x2=é") == ["x", "é"]
    assert unknown_pieces(char_tokenizer, "12+34=") == []


def test_unknown_pieces_of_a_word_tokenizer_are_words():
    assert unknown_pieces(word_tokenizer(["red", "blue"]), "red green blue purple") == ["green", "purple"]


def test_check_vocabulary_is_one_line_naming_the_text_and_pieces(char_tokenizer):
    with pytest.raises(UserError) as info:
        check_vocabulary(char_tokenizer, ["1+1=", "2\n+x="], "train.jsonl row 2")
    assert str(info.value).startswith("train.jsonl row 2: '2\\n+x=' holds '\\n', 'x', outside the tokenizer's vocabulary")
    assert "\n" not in str(info.value)
