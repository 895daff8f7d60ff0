"""Text to token ids for every stage: prompts, and supervised rows with their labels.

A tokenizer with a chat template (a real instruct checkpoint, e.g. Qwen2.5) gets its prompts rendered by
`apply_chat_template(..., add_generation_prompt=True)`: an optional system turn (the example's `system`, else
`model.system_prompt`), the prompt as the user turn, then the assistant header. A tokenizer without one (the
character tokenizer of the default pipeline), or `model.chat_template: off`, keeps the raw prompt text. RL
rollouts, evaluation, SFT, preference pairs and teacher contexts all encode prompts through `encode_prompts`,
so a model is trained and evaluated on the prompts it is sampled from.

Supervised rows (SFT): a `(prompt, completion)` example is the conversation [system, user: prompt, assistant:
completion]; an example with `messages` is that conversation. Loss falls on the assistant turns only, end of
turn included: the template's own assistant mask (`{% generation %}` blocks) when it has one, else each
assistant turn found by rendering the conversation up to it. Without a template: prompt + completion + EOS,
loss on the completion and EOS.

`model.max_prompt_tokens` > 0 left-truncates a longer prompt (everything before the first supervised token of a
row): its last tokens, those next to the answer, are kept. The settings travel on the tokenizer
(`configure_prompts`, called once where a stage prepares its model), so every caller encodes the same way.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from posttrain.errors import UserError

_GENERATION_BLOCK = re.compile(r"\{%-?\s*generation\s*-?%\}")
_FORMAT = "posttrain_prompt_format"  # the tokenizer attribute holding its PromptFormat


@dataclass(frozen=True)
class PromptFormat:
    chat_template: Literal["auto", "off"] = "auto"
    system_prompt: str | None = None
    max_prompt_tokens: int = 0  # 0: no limit


class Prompted(Protocol):  # an Example (tasks/base.py), seen from below it
    prompt: str
    system: str | None


def prompt_format(tokenizer: PreTrainedTokenizerBase) -> PromptFormat:
    return getattr(tokenizer, _FORMAT, None) or PromptFormat()


def uses_chat(tokenizer: PreTrainedTokenizerBase) -> bool:
    return prompt_format(tokenizer).chat_template == "auto" and bool(getattr(tokenizer, "chat_template", None))


def configure_prompts(tokenizer: PreTrainedTokenizerBase, fmt: PromptFormat) -> None:
    """Attach `fmt` to `tokenizer`. With a chat template, the tokenizer's EOS becomes the template's end-of-turn
    token when they differ (a base checkpoint whose EOS is `<|endoftext|>` but whose template ends turns with
    `<|im_end|>`): sampling stops, and SFT teaches to stop, where an assistant turn ends."""
    setattr(tokenizer, _FORMAT, fmt)
    if uses_chat(tokenizer):
        end = end_of_turn(tokenizer)
        if end is not None and end != tokenizer.eos_token:
            tokenizer.eos_token = end


def end_of_turn(tokenizer: PreTrainedTokenizerBase) -> str | None:
    """The first special token the template writes after an assistant turn's content, or None."""
    turns = [{"role": "user", "content": "1"}, {"role": "assistant", "content": "2"}]
    before = _render(tokenizer, turns[:1], add_generation_prompt=True)
    after = _render(tokenizer, turns)[len(before):]
    special = set(tokenizer.all_special_ids) | {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    return next((tokenizer.convert_ids_to_tokens(i) for i in after if i in special), None)


def _render(tokenizer: PreTrainedTokenizerBase, messages: Sequence[Mapping[str, str]], **kwargs) -> list[int]:
    return list(tokenizer.apply_chat_template(list(messages), tokenize=True, return_dict=True, **kwargs)["input_ids"])


def _with_system(messages: Sequence[Mapping[str, str]], system: str | None) -> list[Mapping[str, str]]:
    has_own = bool(messages) and messages[0].get("role") == "system"
    return list(messages) if has_own or system is None else [{"role": "system", "content": system}, *messages]


def _truncate(ids: list[int], limit: int) -> list[int]:
    return ids[-limit:] if limit and len(ids) > limit else ids


def prompt_ids(tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str | Prompted]) -> list[list[int]]:
    """The token ids of each prompt (a text, or an example with `prompt` and `system`), as the model reads it."""
    fmt = prompt_format(tokenizer)
    texts = [p if isinstance(p, str) else p.prompt for p in prompts]
    if uses_chat(tokenizer):
        systems = [None if isinstance(p, str) else p.system for p in prompts]
        conversations = [_with_system([{"role": "user", "content": t}], s or fmt.system_prompt) for t, s in zip(texts, systems)]
        rows = [_render(tokenizer, c, add_generation_prompt=True) for c in conversations]
    else:
        rows = tokenizer(texts, add_special_tokens=False).input_ids
    return [_truncate(list(r), fmt.max_prompt_tokens) for r in rows]


def encode_prompts(tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str | Prompted], device: torch.device) -> tuple[Tensor, Tensor]:
    """Left-padded prompt ids and attention mask [N, P]."""
    enc = tokenizer.pad({"input_ids": prompt_ids(tokenizer, prompts)}, padding=True, padding_side="left", return_tensors="pt")
    return enc["input_ids"].to(device), enc["attention_mask"].to(device)


def conversation_row(tokenizer: PreTrainedTokenizerBase, messages: Sequence[Mapping[str, str]]) -> tuple[list[int], list[bool]]:
    """The rendered conversation's ids and its assistant mask (True on every token of an assistant turn,
    end of turn included)."""
    if _GENERATION_BLOCK.search(tokenizer.chat_template or ""):
        enc = tokenizer.apply_chat_template(list(messages), tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
        return list(enc["input_ids"]), [bool(m) for m in enc["assistant_masks"]]
    ids = _render(tokenizer, messages)
    mask = [False] * len(ids)
    for i, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        start, through = len(_render(tokenizer, messages[:i], add_generation_prompt=True)), _render(tokenizer, messages[: i + 1])
        if ids[: len(through)] != through:
            raise UserError("the chat template does not render a conversation as the sum of its turns; mark the assistant "
                            "turns with {% generation %} ... {% endgeneration %} for SFT on messages")
        turn = through[start:]
        end = turn.index(tokenizer.eos_token_id) + 1 if tokenizer.eos_token_id in turn else len(turn)  # nothing after end of turn
        mask[start : start + end] = [True] * end
    return ids, mask


def supervised_row(tokenizer: PreTrainedTokenizerBase, example) -> tuple[list[int], list[int]]:
    """Ids and labels (-100 where no loss falls) of one SFT example: its `messages`, or prompt -> completion."""
    fmt = prompt_format(tokenizer)
    if example.messages is None and not uses_chat(tokenizer):
        prompt = _truncate(tokenizer.encode(example.prompt, add_special_tokens=False), fmt.max_prompt_tokens)
        completion = tokenizer.encode(example.completion, add_special_tokens=False) + [tokenizer.eos_token_id]
        return prompt + completion, [-100] * len(prompt) + completion
    if not uses_chat(tokenizer):
        raise UserError("an example with `messages` needs a tokenizer with a chat template (and model.chat_template: auto)")
    messages = example.messages or [{"role": "user", "content": example.prompt}, {"role": "assistant", "content": example.completion}]
    ids, mask = conversation_row(tokenizer, _with_system(messages, example.system or fmt.system_prompt))
    if not any(mask):
        raise UserError(f"a conversation has no assistant turn to learn from: {str(list(messages))[:80]}")
    first = mask.index(True)
    cut = first - len(_truncate(ids[:first], fmt.max_prompt_tokens))
    return ids[cut:], [t if m else -100 for t, m in zip(ids[cut:], mask[cut:])]


def encode_supervised(tokenizer: PreTrainedTokenizerBase, examples: Sequence) -> tuple[Tensor, Tensor, Tensor]:
    """Right-padded ids, attention mask and labels [N, W] of SFT examples (`supervised_row` each)."""
    rows = [supervised_row(tokenizer, e) for e in examples]
    width = max(len(ids) for ids, _ in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (row, target) in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        labels[i, : len(row)] = torch.tensor(target)
        mask[i, : len(row)] = 1
    return ids, mask, labels
