"""A frozen image-text encoder: a transformers `CLIPModel` (Radford et al. 2021, arXiv 2103.00020) with its
tokenizer, behind one small interface, so a tiny CLIP trained in the repo (recipes/safe_rl/trainer.py) and a real CLIP
checkpoint (e.g. openai/clip-vit-base-patch32, downloaded by the user) load the same way, by path:

    encoder = ImageTextEncoder.load(path)         # CLIPModel.from_pretrained + AutoTokenizer (+ the image processor's mean / std)
    encoder.embed_images(frames)                  # [N, H, W, 3] uint8 -> [N, D], unit norm
    encoder.embed_texts(["a car driving safely"]) # -> [M, D], unit norm

Frames are resized (bicubic) to the vision tower's `image_size` and normalised with the checkpoint's image mean /
std in torch (a square frame: CLIP's resize-then-centre-crop is a plain resize). Loaded encoders are frozen:
`requires_grad` off on every parameter, eval mode, and every embedding is computed under `torch.no_grad` (the
embeddings carry no gradient; `assert_frozen` checks both).

`tiny_clip(words, ...)` builds a small CLIPModel from a config with a closed word vocabulary (models/tokenizer.py's
`word_tokenizer`, an end-of-text token appended to every text, where CLIP pools the text tower).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import AutoTokenizer, CLIPConfig, CLIPModel, PreTrainedTokenizerBase

from posttrain.errors import UserError

CLIP_MEAN, CLIP_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)  # CLIP's image statistics
PREPROCESSOR = "preprocessor_config.json"


def tiny_clip(words: list[str], image_size: int, patch_size: int, hidden_size: int, layers: int, heads: int, embed_dim: int):
    """(a fresh CLIPModel, its word-level tokenizer) for texts made of `words`."""
    from tokenizers.processors import TemplateProcessing

    from posttrain.models.tokenizer import EOS, word_tokenizer

    tokenizer = word_tokenizer(words)
    tokenizer.backend_tokenizer.post_processor = TemplateProcessing(single=f"$A {EOS}", special_tokens=[(EOS, tokenizer.eos_token_id)])
    tokenizer.padding_side = "right"  # CLIP pools at the first end-of-text token; the causal text tower reads left to right
    common = {"hidden_size": hidden_size, "intermediate_size": 4 * hidden_size, "num_hidden_layers": layers, "num_attention_heads": heads}
    config = CLIPConfig(
        text_config={**common, "vocab_size": len(tokenizer), "max_position_embeddings": 32, "pad_token_id": tokenizer.pad_token_id,
                     "eos_token_id": tokenizer.eos_token_id, "bos_token_id": tokenizer.eos_token_id},
        vision_config={**common, "image_size": image_size, "patch_size": patch_size, "num_channels": 3},
        projection_dim=embed_dim,
    )
    return CLIPModel(config), tokenizer


def save_image_text(model: CLIPModel, tokenizer: PreTrainedTokenizerBase, out: Path) -> None:
    """A directory `ImageTextEncoder.load` (and CLIPModel.from_pretrained) reads back."""
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / PREPROCESSOR).write_text(json.dumps({"image_mean": list(CLIP_MEAN), "image_std": list(CLIP_STD)}, indent=1) + "\n")


class ImageTextEncoder:
    """A CLIP model and its tokenizer, frozen (see the module docstring)."""

    def __init__(self, model: CLIPModel, tokenizer: PreTrainedTokenizerBase, mean=CLIP_MEAN, std=CLIP_STD):
        self.model, self.tokenizer = model.eval(), tokenizer
        self.model.requires_grad_(False)
        self.mean, self.std = torch.tensor(mean).view(1, 3, 1, 1), torch.tensor(std).view(1, 3, 1, 1)

    @classmethod
    def load(cls, path: Path | str) -> "ImageTextEncoder":
        path = Path(path)
        if not (path / "config.json").is_file():
            raise UserError(f"image-text encoder not found: {path} has no config.json (a CLIP checkpoint directory)")
        model = CLIPModel.from_pretrained(path)
        stats = json.loads((path / PREPROCESSOR).read_text()) if (path / PREPROCESSOR).is_file() else {}
        return cls(model, AutoTokenizer.from_pretrained(path), stats.get("image_mean", CLIP_MEAN), stats.get("image_std", CLIP_STD))

    @property
    def dim(self) -> int:
        return int(self.model.config.projection_dim)

    def pixels(self, frames) -> Tensor:
        """[N, 3, S, S] normalised pixel values of uint8 frames [N, H, W, 3] (S: the vision tower's image size)."""
        x = torch.as_tensor(frames).permute(0, 3, 1, 2).float() / 255.0
        size = self.model.config.vision_config.image_size
        if x.shape[-2:] != (size, size):
            x = F.interpolate(x, size=(size, size), mode="bicubic", align_corners=False).clamp(0, 1)
        return (x - self.mean) / self.std

    def image_features(self, pixels: Tensor) -> Tensor:
        """[N, D] unit-norm image embeddings (with gradient when the caller trains the model)."""
        return F.normalize(_features(self.model.get_image_features(pixel_values=pixels)), dim=-1)

    def text_features(self, texts: list[str]) -> Tensor:
        enc = self.tokenizer(list(texts), padding=True, return_tensors="pt")
        return F.normalize(_features(self.model.get_text_features(input_ids=enc.input_ids, attention_mask=enc.attention_mask)), dim=-1)

    @torch.no_grad()
    def embed_images(self, frames, batch_size: int = 512) -> Tensor:
        return torch.cat([self.image_features(self.pixels(frames[i: i + batch_size])) for i in range(0, len(frames), batch_size)])

    @torch.no_grad()
    def embed_texts(self, texts: list[str]) -> Tensor:
        return self.text_features(texts)

    def assert_frozen(self, *embeddings: Tensor) -> None:
        """Raise if a parameter can learn or an embedding carries gradient (the encoders are frozen)."""
        trainable = [n for n, p in self.model.named_parameters() if p.requires_grad]
        if trainable or any(e.requires_grad for e in embeddings):
            raise AssertionError(f"the image-text encoder is not frozen: {trainable[:3] or 'an embedding has a gradient'}")


def _features(output) -> Tensor:
    """The projected embedding of `get_*_features` (a tensor; newer transformers may return an output object)."""
    return output if isinstance(output, Tensor) else output.pooler_output
