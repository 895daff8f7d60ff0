"""A vision-language model in the LLaVA layout (Liu et al. 2023, arXiv 2304.08485, §4.1: a vision encoder's patch
features, projected into the word-embedding space, enter the language model as soft tokens before the text):

    soft = W2 GELU(W1 patchify(image)) + pos          [B, N_patches, H_lm]     PatchEncoder
    logits = LM(inputs_embeds = [soft ; embed(prompt) ; embed(completion)])   models/soft_tokens.py (shared with
                                                                              MotionInsight's evaluator)

`VisionLanguage` is the interface VisKG's loops (recipes/viskg/trainer.py) use; two kinds of model implement it:

    vlm = VisionLanguageModel.tiny(words, image_size, patch_size, hidden_size, layers, heads)   # from a config
    vlm.save(path);  VisionLanguageModel.load(path)        # path/: vlm.json, vision.safetensors, language_model/
    VisionLanguageModel.around(lm_path, image_size, patch_size)   # any transformers causal LM directory (or hub id,
                                                                   # downloaded by the user) + a fresh patch encoder
    NativeVLM.load(path)      # recipes/viskg/native_vlm.py: a transformers image-text-to-text checkpoint (LLaVA, ...) with
                              # its processor (image processor, tokenizer with an image token, chat template)

`load_vlm(path)` picks by what the directory holds. `language_model/` is a plain transformers directory
(`AutoModelForCausalLM.from_pretrained` + its tokenizer), so a real pretrained language model takes the tiny one's
place through the same `load`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch
from safetensors.torch import load_model, save_model
from torch import Tensor, nn
from transformers import AutoModelForCausalLM, PreTrainedTokenizerBase, Qwen2Config

from posttrain.errors import UserError
from posttrain.models.soft_tokens import SoftTokenLM
from posttrain.rollout.decode import Samples, sample_soft_tokens

SPEC = "vlm.json"
VISION = "vision.safetensors"
LANGUAGE = "language_model"


@runtime_checkable
class VisionLanguage(Protocol):
    """What VisKG's SFT, RL and evaluation need of a vision-language model (images: uint8 [B, S, S, 3])."""

    tokenizer: PreTrainedTokenizerBase

    def encode_prompts(self, texts: list[str], images: Tensor) -> tuple[Tensor, Tensor]:
        """(left-padded prompt ids [B, P], mask [B, P]) of one question per image, in the model's prompt format."""

    def completion_logp(self, images: Tensor, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor,
                        completion_mask: Tensor, temperature: float = 1.0) -> Tensor:
        """[B, T] log-probabilities at `temperature` of the completion tokens given image and prompt (0 where
        completion_mask is 0)."""

    def sample(self, images: Tensor, prompt_ids: Tensor, prompt_mask: Tensor, max_new_tokens: int, temperature: float,
               generator: torch.Generator | None = None) -> Samples:
        """One completion per row from the rollout engine, each token's log-prob recorded; temperature 0 is greedy."""

    def generate(self, images: Tensor, prompt_ids: Tensor, prompt_mask: Tensor, max_new_tokens: int, temperature: float,
                 generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """(completion ids [B, T], mask [B, T]: 1 up to and including EOS) of `sample`."""

    def save(self, out: Path) -> None:
        """A directory `load_vlm` reads back."""


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


class VisionLanguageModel(SoftTokenLM):
    """A patch encoder's soft tokens before the question, into a causal language model (see the module docstring)."""

    def __init__(self, vision: PatchEncoder, language_model, tokenizer: PreTrainedTokenizerBase):
        super().__init__(vision, language_model, tokenizer)

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
        save_model(self.encoder, str(out / VISION))
        (out / SPEC).write_text(json.dumps(self.encoder.spec, indent=1) + "\n")

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

    # -- the VisionLanguage interface ------------------------------------------------------------------------
    def encode_prompts(self, texts: list[str], images: Tensor) -> tuple[Tensor, Tensor]:
        """The raw question text (the soft tokens take the image's place in front of it)."""
        enc = self.tokenizer(texts, padding=True, return_tensors="pt", add_special_tokens=False)
        return enc.input_ids, enc.attention_mask

    def prefix(self, images: Tensor, prompt_ids: Tensor, prompt_mask: Tensor) -> tuple[Tensor, Tensor]:
        """(embeddings [B, L, H], attention mask [B, L]) of [pads, soft tokens, prompt] for left-padded prompts."""
        return self.splice(self.encoder(images), prompt_ids, prompt_mask)

    def completion_logp(self, images: Tensor, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor, completion_mask: Tensor,
                        temperature: float = 1.0) -> Tensor:
        return self.completion_logp_from(self.encoder(images), prompt_ids, prompt_mask, completion_ids, completion_mask, temperature)

    @torch.no_grad()
    def sample(self, images: Tensor, prompt_ids: Tensor, prompt_mask: Tensor, max_new_tokens: int, temperature: float,
               generator: torch.Generator | None = None) -> Samples:
        return sample_soft_tokens(self, self.encoder(images), prompt_ids, prompt_mask, max_new_tokens, temperature, generator)

    def generate(self, images: Tensor, prompt_ids: Tensor, prompt_mask: Tensor, max_new_tokens: int, temperature: float,
                 generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        samples = self.sample(images, prompt_ids, prompt_mask, max_new_tokens, temperature, generator)
        return samples.completion_ids, samples.completion_mask


def load_vlm(path: str | Path) -> VisionLanguage:
    """The vision-language model saved at `path`: a VisionLanguageModel directory (vlm.json) or a transformers
    image-text-to-text checkpoint with its processor (recipes/viskg/native_vlm.py); anything else is one clear error."""
    path = Path(path)
    if (path / SPEC).is_file():
        return VisionLanguageModel.load(path)
    from posttrain.recipes.viskg.native_vlm import NativeVLM

    return NativeVLM.load(path)
