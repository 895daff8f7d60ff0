"""A vision-language model in the LLaVA layout (Liu et al. 2023, arXiv 2304.08485, §4.1: a vision encoder's patch
features, projected into the word-embedding space, enter the language model as soft tokens before the text):

    soft = W2 GELU(W1 patchify(image)) + pos          [B, N_patches, H_lm]     PatchEncoder
    logits = LM(inputs_embeds = [soft ; embed(prompt) ; embed(completion)])

One interface for the tiny model built from a config and a model loaded by path:

    vlm = VisionLanguageModel.tiny(words, image_size, patch_size, hidden_size, layers, heads)   # from a config
    vlm.save(path);  VisionLanguageModel.load(path)        # path/: vlm.json, vision.safetensors, language_model/
    VisionLanguageModel.around(lm_path, image_size, patch_size)   # any transformers causal LM directory (or hub id,
                                                                   # downloaded by the user) + a fresh patch encoder

`language_model/` is a plain transformers directory (`AutoModelForCausalLM.from_pretrained` + its tokenizer), so a
real pretrained language model takes the tiny one's place through the same `load`. Prompts are left-padded as a
whole, [pad .. pad, soft tokens, question], so completions start at one column; positions count real tokens only.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_model, save_model
from torch import Tensor, nn
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase, Qwen2Config

from posttrain.errors import UserError

SPEC = "vlm.json"
VISION = "vision.safetensors"
LANGUAGE = "language_model"


class PatchEncoder(nn.Module):
    """Non-overlapping patches -> an MLP -> one soft token per patch, with a learned position embedding."""

    def __init__(self, image_size: int, patch_size: int, width: int, out_dim: int):
        super().__init__()
        if image_size % patch_size:
            raise UserError(f"image size {image_size} is not a multiple of the patch size {patch_size}")
        self.spec = {"image_size": image_size, "patch_size": patch_size, "width": width, "out_dim": out_dim}
        self.patchify = nn.Conv2d(3, width, kernel_size=patch_size, stride=patch_size)
        self.project = nn.Sequential(nn.GELU(), nn.Linear(width, out_dim))
        self.position = nn.Parameter(torch.zeros((image_size // patch_size) ** 2, out_dim))
        nn.init.normal_(self.position, std=0.02)

    @property
    def n_tokens(self) -> int:
        return int(self.position.shape[0])

    def forward(self, images: Tensor) -> Tensor:
        """uint8 images [B, S, S, 3] -> soft tokens [B, N, out_dim]."""
        x = images.permute(0, 3, 1, 2).float() / 255.0 - 0.5
        return self.project(self.patchify(x).flatten(2).transpose(1, 2)) + self.position


class VisionLanguageModel(nn.Module):
    def __init__(self, vision: PatchEncoder, language_model, tokenizer: PreTrainedTokenizerBase):
        super().__init__()
        self.vision, self.language_model, self.tokenizer = vision, language_model, tokenizer

    # -- building, saving, loading --------------------------------------------------------------------------
    @classmethod
    def tiny(cls, words: list[str], image_size: int, patch_size: int, hidden_size: int, layers: int, heads: int,
             max_positions: int = 512) -> "VisionLanguageModel":
        """A fresh Qwen2-shaped language model over a word-level vocabulary, with a fresh patch encoder."""
        from posttrain.models.tokenizer import word_tokenizer

        tokenizer = word_tokenizer(words)
        config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=4 * hidden_size, num_hidden_layers=layers,
                             num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=max_positions,
                             pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None, tie_word_embeddings=True)
        return cls(PatchEncoder(image_size, patch_size, hidden_size, hidden_size), AutoModelForCausalLM.from_config(config), tokenizer)

    @classmethod
    def around(cls, lm_path: str | Path, image_size: int, patch_size: int) -> "VisionLanguageModel":
        """A pretrained causal language model (a transformers directory) with a fresh patch encoder into its embeddings."""
        from posttrain.models.factory import load_pretrained

        lm, tokenizer = load_pretrained(lm_path)
        hidden = int(lm.get_input_embeddings().weight.shape[1])
        return cls(PatchEncoder(image_size, patch_size, hidden, hidden), lm, tokenizer)

    def save(self, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.language_model.save_pretrained(out / LANGUAGE)
        self.tokenizer.save_pretrained(out / LANGUAGE)
        save_model(self.vision, str(out / VISION))
        (out / SPEC).write_text(json.dumps(self.vision.spec, indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "VisionLanguageModel":
        path = Path(path)
        if not (path / SPEC).is_file():
            raise UserError(f"vision-language model not found: {path} has no {SPEC} (a directory VisionLanguageModel.save wrote)")
        from posttrain.models.factory import load_pretrained

        lm, tokenizer = load_pretrained(path / LANGUAGE)
        vision = PatchEncoder(**json.loads((path / SPEC).read_text()))
        load_model(vision, str(path / VISION))
        return cls(vision, lm, tokenizer)

    # -- forward passes -------------------------------------------------------------------------------------
    def prefix(self, images: Tensor, prompt_ids: Tensor, prompt_mask: Tensor) -> tuple[Tensor, Tensor]:
        """(embeddings [B, L, H], attention mask [B, L]) of [pads, soft tokens, prompt] for left-padded prompts."""
        soft = self.vision(images)
        words = self.language_model.get_input_embeddings()(prompt_ids)
        rows, masks = [], []
        ones = prompt_mask.new_ones(soft.shape[1])
        for i in range(len(prompt_ids)):
            pads = int((prompt_mask[i] == 0).sum())
            rows.append(torch.cat([words[i, :pads], soft[i], words[i, pads:]]))
            masks.append(torch.cat([prompt_mask[i, :pads], ones, prompt_mask[i, pads:]]))
        return torch.stack(rows), torch.stack(masks)

    def _run(self, embeds: Tensor, mask: Tensor, cache=None):
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        if cache is None:
            return self.language_model(inputs_embeds=embeds, attention_mask=mask, position_ids=positions)
        return self.language_model(inputs_embeds=embeds, attention_mask=mask, position_ids=positions[:, -embeds.shape[1]:], cache=cache,
                                   use_cache=True, logits_to_keep=1)

    def completion_logp(self, images: Tensor, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor, completion_mask: Tensor) -> Tensor:
        """[B, T] log-probabilities of the completion tokens (0 where completion_mask is 0)."""
        embeds, mask = self.prefix(images, prompt_ids, prompt_mask)
        full = torch.cat([embeds, self.language_model.get_input_embeddings()(completion_ids)], dim=1)
        logits = self._run(full, torch.cat([mask, completion_mask.to(mask.dtype)], dim=1)).logits
        logits = logits[:, embeds.shape[1] - 1:-1].float()
        logp = torch.gather(F.log_softmax(logits, dim=-1), 2, completion_ids[..., None]).squeeze(-1)
        return logp * completion_mask

    @torch.no_grad()
    def generate(self, images: Tensor, prompt_ids: Tensor, prompt_mask: Tensor, max_new_tokens: int, temperature: float,
                 generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """(completion ids [B, T], completion mask [B, T]: 1 up to and including EOS); temperature 0 is greedy."""
        from transformers import DynamicCache

        eos, pad = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        embeds, mask = self.prefix(images, prompt_ids, prompt_mask)
        cache = DynamicCache()
        out = self._run(embeds, mask, cache)
        tokens, alive = [], torch.ones(len(prompt_ids), dtype=torch.bool)
        for _ in range(max_new_tokens):
            logits = out.logits[:, -1].float()
            if temperature > 0:
                nxt = torch.multinomial(F.softmax(logits / temperature, dim=-1), 1, generator=generator).squeeze(-1)
            else:
                nxt = logits.argmax(-1)
            nxt = torch.where(alive, nxt, torch.full_like(nxt, pad))
            tokens.append(torch.stack([nxt, alive.long()], dim=1))
            alive = alive & (nxt != eos)
            if not alive.any():
                break
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            out = self._run(self.language_model.get_input_embeddings()(nxt[:, None]), mask, cache)
        stacked = torch.stack(tokens, dim=1)
        return stacked[..., 0], stacked[..., 1]
