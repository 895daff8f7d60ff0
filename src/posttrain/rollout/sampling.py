"""Prompts in, texts out, around the engine (rollout/decode.py's `sample`, re-exported here with `Samples`).

`generate` is the one encode -> sample -> decode helper every loop uses (rollouts, teachers' traces, evaluation, reward models).
Prompts are encoded by models/chat.py (chat template or raw text). Stop strings (`rl.stop`, `eval.stop`) end a
row like EOS does, on the token that completes one; its text is cut before the stop string.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import torch
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from posttrain.models.chat import encode_prompts
from posttrain.models.decoders import use_cuda_graphs
from posttrain.rollout.decode import Samples, categorical, sample

__all__ = [
    "Samples", "StopStrings", "categorical", "concat_samples", "decode_completions", "encode_prompts", "generate", "sample", "use_cuda_graphs",
]


class StopStrings:
    """`stop` strings as a sampler's stop test: a row stops on the token after which its decoded text holds one
    (each step decodes only the last few tokens of every row); `cut` removes a stop string and what follows."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stop: Sequence[str]):
        self.tokenizer, self.stop = tokenizer, tuple(s for s in stop if s)
        self.window = max((len(s.encode()) for s in self.stop), default=0) + 1  # a token holds at least one byte

    def __bool__(self) -> bool:
        return bool(self.stop)

    def __call__(self, tokens: Tensor) -> Tensor:
        return torch.tensor(self.holds(tokens[:, -self.window :].tolist()), device=tokens.device)

    def holds(self, rows: Sequence[Sequence[int]]) -> list[bool]:
        """Whether the text of each row's last tokens (rows of any length) holds a stop string."""
        tails = self.tokenizer.batch_decode([list(r)[-self.window :] for r in rows], skip_special_tokens=True)
        return [any(s in tail for s in self.stop) for tail in tails]

    def cut(self, text: str) -> str:
        ends = [i for i in (text.find(s) for s in self.stop) if i >= 0]
        return text[: min(ends)] if ends else text


def decode_completions(tokenizer: PreTrainedTokenizerBase, samples: Samples, stop: StopStrings | None = None) -> list[str]:
    """The produced text of each completion, without EOS, padding or environment observations (and cut before
    a stop string)."""
    ids = samples.completion_ids.masked_fill(samples.completion_mask == 0, tokenizer.pad_token_id)
    texts = tokenizer.batch_decode(ids.cpu(), skip_special_tokens=True)
    return [stop.cut(t) for t in texts] if stop else texts


@torch.no_grad()
def generate(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompts: Sequence, max_new_tokens: int, *, group_size: int = 1,
    temperature: float = 1.0, greedy: bool = False, generator: torch.Generator | None = None, sampler=None, chunk: int = 0,
    stop: Sequence[str] = (),
) -> tuple[Samples, list[str]]:
    """`group_size` completions of each prompt (a text or an example; rows prompt-major: prompt i's samples are rows
    i*G .. i*G+G-1) and their decoded texts. `sampler` replaces `sample` (a multi-turn environment's episode
    sampler); `chunk` > 0 generates at most that many prompts at a time (bounded memory), concatenating the
    results; `stop` strings end a completion (`sample` only)."""
    stops = StopStrings(tokenizer, stop)
    draw = sampler or (partial(sample, stop=stops) if stops else sample)
    device = next(model.parameters()).device
    step = chunk if chunk > 0 else max(len(prompts), 1)
    parts = []
    for start in range(0, len(prompts), step):
        ids, mask = encode_prompts(tokenizer, prompts[start : start + step], device)
        parts.append(draw(
            model, ids, mask, group_size=group_size, max_new_tokens=max_new_tokens, eos_id=tokenizer.eos_token_id,
            pad_id=tokenizer.pad_token_id, temperature=temperature, greedy=greedy, generator=generator,
        ))
    samples = parts[0] if len(parts) == 1 else concat_samples(parts, tokenizer.pad_token_id)
    return samples, decode_completions(tokenizer, samples, stops)


def concat_samples(parts: list[Samples], pad_id: int) -> Samples:
    """Row-wise concatenation of samples of different widths (padded on the right)."""
    width = max(p.completion_ids.shape[1] for p in parts)

    def pad(t: Tensor, value) -> Tensor:
        return torch.nn.functional.pad(t, (0, width - t.shape[1]), value=value)

    attention = None
    if any(p.attention_mask is not None for p in parts):
        attention = torch.cat([pad(p.attention, 0) for p in parts])
    return Samples(
        torch.cat([pad(p.completion_ids, pad_id) for p in parts]), torch.cat([pad(p.completion_mask, 0) for p in parts]),
        torch.cat([pad(p.logp, 0.0) for p in parts]), torch.cat([p.finished for p in parts]), attention,
    )
