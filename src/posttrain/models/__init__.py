"""Policies, references and tokenizers: built tiny from a config, or loaded by path / hub id."""

from posttrain.models.factory import (build_tiny, load_pretrained, load_tokenizer, maybe_lora, prepare_model, save_pretrained,
                                      select_device)
from posttrain.models.tokenizer import check_vocabulary, train_bpe_tokenizer, train_char_tokenizer

__all__ = [
    "build_tiny", "check_vocabulary", "load_pretrained", "load_tokenizer", "maybe_lora", "prepare_model", "save_pretrained",
    "select_device", "train_bpe_tokenizer", "train_char_tokenizer",
]
