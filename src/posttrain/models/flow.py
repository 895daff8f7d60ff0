"""The conditional flow-matching image model: a diffusers `UNet2DModel` plus an instruction encoder.

CrossTimeEdit (spec §1) generates the past street view S_old from the recent one S_new, the satellite
pair (A_old, A_new) and an instruction. Here the image conditions are concatenated to the noisy sample as
channels, [x_t, S_new, A_old, A_new] (12 channels), and the instruction enters through the UNet's class
embedding (`class_embed_type="identity"`): a hashed bag of words, projected to the time-embedding width and
added to the timestep embedding. The network predicts the rectified-flow velocity v = noise - x_0 at noise
level sigma (x_sigma = (1 - sigma) x_0 + sigma noise), with timestep = 1000 sigma as diffusers' flow-matching
schedulers use. Images live in [-1, 1].

A saved model is a directory: `unet/` (diffusers `save_pretrained`), `text_proj.safetensors` and
`flow_config.json`; `load_flow_model(path)` reads it back with `UNet2DModel.from_pretrained`. LoRA adapters
go through peft on the UNet and are merged before saving. (A FLUX checkpoint has a different transformer and
text encoder; loading one needs its own conditioning adapter, which this module does not provide.)
"""

from __future__ import annotations

import json
import re
import zlib
from pathlib import Path

import torch
from torch import Tensor, nn

from posttrain.config import FlowModelConfig, LoraConfig

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


def load_flow_model(path: str | Path) -> ConditionalFlowModel:
    from diffusers import UNet2DModel
    from safetensors.torch import load_file

    path = Path(path)
    meta = json.loads((path / "flow_config.json").read_text())
    model = ConditionalFlowModel(UNet2DModel.from_pretrained(path / "unet"), meta["text_dim"])
    model.text_proj.load_state_dict(load_file(path / "text_proj.safetensors"))
    return model


def save_flow_model(model: ConditionalFlowModel, out: Path) -> None:
    """Save a `load_flow_model`-loadable directory; LoRA adapters are merged into the UNet first."""
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    unet = model.unet.merge_and_unload() if hasattr(model.unet, "merge_and_unload") else model.unet
    unet.save_pretrained(out / "unet")
    save_file({k: v.contiguous() for k, v in model.text_proj.state_dict().items()}, out / "text_proj.safetensors")
    (out / "flow_config.json").write_text(json.dumps({"text_dim": model.text_dim, "image_size": model.image_size}) + "\n")


def maybe_flow_lora(model: ConditionalFlowModel, cfg: LoraConfig) -> ConditionalFlowModel:
    """With cfg.r > 0, wrap the UNet in peft LoRA adapters (only they train; the projection is frozen too)."""
    if cfg.r == 0:
        return model
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    peft_cfg = PeftLoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules=list(cfg.target_modules))
    model.unet = get_peft_model(model.unet, peft_cfg)
    model.text_proj.requires_grad_(False)
    return model
