"""The conditional flow-matching image model: a diffusers `UNet2DModel` plus an instruction encoder.

CrossTimeEdit (2026) generates the past street view S_old from the recent one S_new, the satellite
pair (A_old, A_new) and an instruction. Here the image conditions are concatenated to the noisy sample as
channels, [x_t, S_new, A_old, A_new] (12 channels), and the instruction enters through the UNet's class
embedding (`class_embed_type="identity"`): a hashed bag of words, projected to the time-embedding width and
added to the timestep embedding. The network predicts the rectified-flow velocity v = noise - x_0 at noise
level sigma (x_sigma = (1 - sigma) x_0 + sigma noise), with timestep = 1000 sigma as diffusers' flow-matching
schedulers use. Images live in [-1, 1].

A saved model is a directory: `unet/` (diffusers `save_pretrained`), `text_proj.safetensors` and
`flow_config.json`; `load_flow_model(path)` reads it back with `UNet2DModel.from_pretrained`. LoRA adapters
go through peft on the UNet and are merged before saving.

`flow.kind` selects the model family from the `flow_backends` registry: `unet` (this module) or `flux`
(recipes/image/flux.py: a diffusers FLUX checkpoint directory, Kontext-style conditioning, LoRA adapters). Both
expose the same surface to the trainers: `encode_text`, `encode_conditions`, `to_latent` / `from_latent`,
`latent_shape`, `forward(x, sigma, conditions, text) -> velocity`, `add_lora`, `save`. The samplers and
losses run in the model's latent space (pixels here, packed VAE latents for FLUX).
"""

from __future__ import annotations

import json
import re
import zlib
from contextlib import nullcontext
from pathlib import Path

import torch
from torch import Tensor, nn

from posttrain.config import LoraConfig
from posttrain.recipes.image.settings import FlowModelConfig
from posttrain.registry import Registry

flow_backends: Registry = Registry("flow model kind")  # entries: objects with start(cfg, image_size) and load(path)
CONDITION_CHANNELS = 9  # S_new, A_old, A_new


def instruction_features(texts: list[str], dim: int) -> Tensor:
    """[N, dim] L2-normalised hashed counts of the words and word bigrams of each instruction (no vocabulary,
    no download; crc32 makes the hashing stable across processes)."""
    out = torch.zeros(len(texts), dim)
    for row, text in enumerate(texts):
        words = re.findall(r"[a-z]+", text.lower())
        for token in words + [f"{a} {b}" for a, b in zip(words, words[1:])]:
            out[row, zlib.crc32(token.encode()) % dim] += 1.0
    return out / out.norm(dim=1, keepdim=True).clamp(min=1e-8)


class ConditionalFlowModel(nn.Module):
    kind = "unet"

    def __init__(self, unet: nn.Module, text_dim: int):
        super().__init__()
        self.unet = unet
        self.text_dim = text_dim
        time_embed_dim = self.unet.config.block_out_channels[0] * 4
        self.text_proj = nn.Linear(text_dim, time_embed_dim)

    @property
    def image_size(self) -> int:
        return int(self.unet.config.sample_size)

    def forward(self, x: Tensor, sigma: Tensor, conditions: Tensor, text: Tensor) -> Tensor:
        """Velocity [B, 3, H, W] at noise level sigma [B] (or a scalar)."""
        sigma = torch.as_tensor(sigma, dtype=x.dtype, device=x.device).expand(x.shape[0])
        return self.unet(torch.cat([x, conditions], dim=1), sigma * 1000.0, class_labels=self.text_proj(text)).sample

    # the model-family surface the trainers use (see the module docstring); pixels are the latents here
    def encode_text(self, texts: list[str]) -> Tensor:
        return instruction_features(texts, self.text_dim)

    def encode_conditions(self, conditions: Tensor) -> Tensor:
        return conditions

    def to_latent(self, images: Tensor) -> Tensor:
        return images

    def from_latent(self, latents: Tensor) -> Tensor:
        return latents

    def latent_shape(self, n: int) -> tuple[int, ...]:
        return (n, 3, self.image_size, self.image_size)

    def add_lora(self, cfg: LoraConfig) -> "ConditionalFlowModel":
        """Wrap the UNet in peft LoRA adapters (only they train; the projection is frozen too)."""
        from peft import LoraConfig as PeftLoraConfig
        from peft import get_peft_model

        peft_cfg = PeftLoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules=list(cfg.target_modules))
        self.unet = get_peft_model(self.unet, peft_cfg)
        self.text_proj.requires_grad_(False)
        return self

    def save(self, out: Path) -> None:
        """A `load_flow_model`-loadable directory; LoRA adapters are merged into the UNet first."""
        from safetensors.torch import save_file

        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        unet = self.unet.merge_and_unload() if hasattr(self.unet, "merge_and_unload") else self.unet
        unet.save_pretrained(out / "unet")
        save_file({k: v.contiguous() for k, v in self.text_proj.state_dict().items()}, out / "text_proj.safetensors")
        meta = {"kind": self.kind, "text_dim": self.text_dim, "image_size": self.image_size}
        (out / "flow_config.json").write_text(json.dumps(meta) + "\n")


def build_flow_model(cfg: FlowModelConfig, image_size: int) -> ConditionalFlowModel:
    from diffusers import UNet2DModel

    n = len(cfg.block_channels)
    unet = UNet2DModel(
        sample_size=image_size, in_channels=3 + CONDITION_CHANNELS, out_channels=3,
        block_out_channels=tuple(cfg.block_channels), layers_per_block=cfg.layers_per_block,
        down_block_types=("DownBlock2D",) * n, up_block_types=("UpBlock2D",) * n,
        norm_num_groups=cfg.norm_groups, attention_head_dim=cfg.block_channels[-1] // 2,
        class_embed_type="identity",
    )
    return ConditionalFlowModel(unet, cfg.text_dim)


def _load_unet_model(path: str | Path) -> ConditionalFlowModel:
    from diffusers import UNet2DModel
    from safetensors.torch import load_file

    path = Path(path)
    meta = json.loads((path / "flow_config.json").read_text())
    model = ConditionalFlowModel(UNet2DModel.from_pretrained(path / "unet"), meta["text_dim"])
    model.text_proj.load_state_dict(load_file(path / "text_proj.safetensors"))
    return model


class UNetBackend:
    """`flow.kind: unet`: a tiny model from the sizes in `flow`, or a saved one from `flow.path`."""

    @staticmethod
    def start(cfg: FlowModelConfig, image_size: int) -> ConditionalFlowModel:
        return _load_unet_model(cfg.path) if cfg.path else build_flow_model(cfg, image_size)

    load = staticmethod(_load_unet_model)


flow_backends.register("unet")(UNetBackend)


def load_flow_model(path: str | Path):
    """A model saved by `save_flow_model`, read back by the backend named in its flow_config.json; a damaged
    directory is one `UserError` line (models.factory.readable)."""
    import posttrain.recipes.image.flux  # noqa: F401  (registers the `flux` kind)
    from posttrain.models.factory import readable

    with readable(path, "the flow model"):
        meta = json.loads((Path(path) / "flow_config.json").read_text())
        return flow_backends.get(meta.get("kind", "unet")).load(path)


def start_flow_model(cfg: FlowModelConfig, image_size: int):
    """The model flow_sft starts from: the `flow.kind` backend's tiny or saved model, plus LoRA when r > 0."""
    import posttrain.recipes.image.flux  # noqa: F401  (registers the `flux` kind)
    from posttrain.models.factory import readable

    with readable(cfg.path, "the flow model") if cfg.path else nullcontext():
        model = flow_backends.get(cfg.kind).start(cfg, image_size)
    return maybe_flow_lora(model, cfg.lora)


def save_flow_model(model, out: Path) -> None:
    model.save(Path(out))


def maybe_flow_lora(model, cfg: LoraConfig):
    """With cfg.r > 0, add peft LoRA adapters (only they train); a model that already carries trained
    adapters (a saved FLUX LoRA) keeps training those."""
    if cfg.r == 0 or getattr(model, "has_adapters", False):
        return model
    return model.add_lora(cfg)
