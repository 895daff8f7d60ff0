"""Encoder outputs as soft tokens in front of a causal language model: the one vision front-end of VisKG's
vision-language model (recipes/viskg/vlm.py, a patch encoder over images) and MotionInsight's evaluator
(recipes/motion/evaluator.py, a video encoder over motion maps or RGB frames). The LLaVA recipe (Liu et al. 2023,
arXiv 2304.08485, §4.1): the encoder's features, projected to the word-embedding width, enter the language model as
tokens before the text,

    inputs_embeds = [pad .. pad ; soft tokens [N, H] ; embed(prompt) ; embed(completion)]

Prompts are left-padded as a whole, so every completion starts at one column; positions count real tokens only, so a
padded row sees the positions an unpadded one does. Each method keeps its own encoder (any module mapping its input
to [B, N, H]); this module owns the splice and the completion log-probs. Sampling is the rollout engine's
(rollout/decode.py's `sample_soft_tokens`: the spliced embeddings prefill the KV cache, log-probs are recorded).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import PreTrainedTokenizerBase

from posttrain.models.decoders import positions_from_mask


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

    def run(self, embeds: Tensor, mask: Tensor):
        """The language model over `embeds` under `mask`, positions counting real tokens only."""
        return self.language_model(inputs_embeds=embeds, attention_mask=mask, position_ids=positions_from_mask(mask))

    def completion_logits(self, soft: Tensor, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor,
                          completion_mask: Tensor) -> Tensor:
        """[B, T, V] logits of each completion token given the soft tokens, the prompt and the tokens before it."""
        embeds, mask = self.splice(soft, prompt_ids, prompt_mask)
        full = torch.cat([embeds, self.embed(completion_ids)], dim=1)
        return self.run(full, torch.cat([mask, completion_mask.to(mask.dtype)], dim=1)).logits[:, embeds.shape[1] - 1:-1]

    def completion_logp_from(self, soft: Tensor, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor,
                             completion_mask: Tensor, temperature: float = 1.0) -> Tensor:
        """[B, T] log-probabilities of the completion tokens at `temperature` (0 where completion_mask is 0)."""
        logits = self.completion_logits(soft, prompt_ids, prompt_mask, completion_ids, completion_mask)
        return sampled_logp(logits if temperature == 1.0 else logits / temperature, completion_ids, completion_mask)
