"""Turning sampled ids back into text for verifiers and tables."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from posttrain.rollout.engine import Samples


def decode_completions(tokenizer: PreTrainedTokenizerBase, samples: Samples) -> list[str]:
    """The produced text of each completion, without EOS or padding."""
    ids = samples.completion_ids.masked_fill(samples.completion_mask == 0, tokenizer.pad_token_id)
    return tokenizer.batch_decode(ids.cpu(), skip_special_tokens=True)
