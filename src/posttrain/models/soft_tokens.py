"""Encoder outputs as soft tokens in front of a causal language model: the one vision front-end of VisKG's
vision-language model (recipes/viskg/vlm.py, a patch encoder over images) and MotionInsight's evaluator
(recipes/motion/evaluator.py, a video encoder over motion maps or RGB frames). The LLaVA recipe (Liu et al. 2023,
arXiv 2304.08485, §4.1): the encoder's features, projected to the word-embedding width, enter the language model as
tokens before the text,

    inputs_embeds = [pad .. pad ; soft tokens [N, H] ; embed(prompt) ; embed(completion)]

Prompts are left-padded as a whole, so every completion starts at one column; positions count real tokens only, so a
padded row sees the positions an unpadded one does. Each method keeps its own encoder (any module mapping its input
to [B, N, H]); this module owns the splice, the completion log-probs and the KV-cached sampling loop.

`sample_with_cache` is the decoding loop on its own (temperature sampling with an explicit generator, greedy at
temperature 0, EOS ends a row, pad after it); a native image-text-to-text model (models/native_vlm.py) runs it too.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import DynamicCache, PreTrainedTokenizerBase

from posttrain.models.decoders import positions_from_mask


def sample_with_cache(step: Callable[[Tensor | None], Tensor], batch: int, eos: int, pad: int, max_new_tokens: int, temperature: float,
                      generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """(completion ids [B, T], mask [B, T]: 1 up to and including EOS). `step(None)` reads the prompt and returns the
    next-token logits [B, V]; `step(tokens [B])` appends one token per row (to its KV cache) and returns the next."""
    logits = step(None)
    tokens, alive = [], torch.ones(batch, dtype=torch.bool, device=logits.device)
    for _ in range(max_new_tokens):
        logits = logits.float()
        if temperature > 0:
            nxt = torch.multinomial(F.softmax(logits / temperature, dim=-1), 1, generator=generator).squeeze(-1)
        else:
            nxt = logits.argmax(-1)
        nxt = torch.where(alive, nxt, torch.full_like(nxt, pad))
        tokens.append(torch.stack([nxt, alive.long()], dim=1))
        alive = alive & (nxt != eos)
        if not alive.any():
            break
        logits = step(nxt)
    stacked = torch.stack(tokens, dim=1)
    return stacked[..., 0], stacked[..., 1]


def sampled_logp(logits: Tensor, ids: Tensor, mask: Tensor) -> Tensor:
    """[B, T] log-probabilities of `ids` under `logits` [B, T, V] (0 where mask is 0)."""
    return torch.gather(F.log_softmax(logits.float(), dim=-1), 2, ids[..., None]).squeeze(-1) * mask


class SoftTokenLM(nn.Module):
    """`encoder` (input -> [B, N, H] soft tokens) in front of `language_model` (a transformers causal LM)."""

    def __init__(self, encoder: nn.Module, language_model, tokenizer: PreTrainedTokenizerBase):
        super().__init__()
        self.encoder, self.language_model, self.tokenizer = encoder, language_model, tokenizer

    def embed(self, ids: Tensor) -> Tensor:
        return self.language_model.get_input_embeddings()(ids)

    def splice(self, soft: Tensor, prompt_ids: Tensor, prompt_mask: Tensor) -> tuple[Tensor, Tensor]:
        """(embeddings [B, L, H], attention mask [B, L]) of [pads, soft tokens, prompt] for left-padded prompts."""
        words = self.embed(prompt_ids)
        rows, masks = [], []
        ones = prompt_mask.new_ones(soft.shape[1])
        for i in range(len(prompt_ids)):
            pads = int((prompt_mask[i] == 0).sum())
            rows.append(torch.cat([words[i, :pads], soft[i], words[i, pads:]]))
            masks.append(torch.cat([prompt_mask[i, :pads], ones, prompt_mask[i, pads:]]))
        return torch.stack(rows), torch.stack(masks)

    def run(self, embeds: Tensor, mask: Tensor, cache=None):
        """The language model over `embeds` (the last embeds.shape[1] columns of `mask` when a cache holds the rest)."""
        positions = positions_from_mask(mask)
        if cache is None:
            return self.language_model(inputs_embeds=embeds, attention_mask=mask, position_ids=positions)
        return self.language_model(inputs_embeds=embeds, attention_mask=mask, position_ids=positions[:, -embeds.shape[1]:], cache=cache,
                                   use_cache=True, logits_to_keep=1)

    def completion_logits(self, soft: Tensor, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor,
                          completion_mask: Tensor) -> Tensor:
        """[B, T, V] logits of each completion token given the soft tokens, the prompt and the tokens before it."""
        embeds, mask = self.splice(soft, prompt_ids, prompt_mask)
        full = torch.cat([embeds, self.embed(completion_ids)], dim=1)
        return self.run(full, torch.cat([mask, completion_mask.to(mask.dtype)], dim=1)).logits[:, embeds.shape[1] - 1:-1]

    def completion_logp_from(self, soft: Tensor, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor,
                             completion_mask: Tensor) -> Tensor:
        """[B, T] log-probabilities of the completion tokens (0 where completion_mask is 0)."""
        logits = self.completion_logits(soft, prompt_ids, prompt_mask, completion_ids, completion_mask)
        return sampled_logp(logits, completion_ids, completion_mask)

    @torch.no_grad()
    def generate_from(self, soft: Tensor, prompt_ids: Tensor, prompt_mask: Tensor, max_new_tokens: int, temperature: float,
                      generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """(completion ids [B, T], completion mask [B, T]: 1 up to and including EOS); temperature 0 is greedy."""
        embeds, mask = self.splice(soft, prompt_ids, prompt_mask)
        cache, state = DynamicCache(), {"mask": mask}

        def step(tokens: Tensor | None) -> Tensor:
            if tokens is None:
                return self.run(embeds, state["mask"], cache).logits[:, -1]
            state["mask"] = torch.cat([state["mask"], torch.ones_like(state["mask"][:, :1])], dim=1)
            return self.run(self.embed(tokens[:, None]), state["mask"], cache).logits[:, -1]

        return sample_with_cache(step, len(prompt_ids), self.tokenizer.eos_token_id, self.tokenizer.pad_token_id, max_new_tokens,
                                 temperature, generator)
