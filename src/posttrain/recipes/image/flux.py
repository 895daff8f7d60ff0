"""`flow.kind: flux`: a FLUX-family editing model loaded from a diffusers checkpoint directory, trained
through peft LoRA adapters on its transformer.

The checkpoint is what `FluxKontextPipeline.save_pretrained` writes (transformer = `FluxTransformer2DModel`,
`AutoencoderKL`, CLIP + T5 text encoders and their tokenizers, `FlowMatchEulerDiscreteScheduler`), read
with `FluxKontextPipeline.from_pretrained(path)`; nothing is downloaded. Conditioning follows FLUX.1
Kontext (Labs et al. 2025, "FLUX.1 Kontext: Flow Matching for In-Context Image Generation and Editing in
Latent Space", arXiv 2506.15742, sec. 3): each conditioning image is VAE-encoded, packed into 2x2 latent
patches like the target, and appended to the target's tokens; the 3D RoPE ids of conditioning image k
carry k in their first axis (the target has 0), so the transformer tells the images apart while keeping
their spatial grids aligned. CrossTimeEdit has three conditioning images (S_new, A_old, A_new: ids 1, 2, 3).
The instruction goes through the pipeline's own `encode_prompt` (T5 sequence + pooled CLIP). The velocity
is read off the target's tokens. Sampling and losses run on the packed latents [B, tokens, 4 C].

Only the LoRA adapters train (the base, VAE and text encoders stay frozen). A saved model is a directory with
`flow_config.json` (kind, the base checkpoint's absolute path, image size, guidance) and `transformer_lora/`
(peft `save_pretrained`: adapter_config.json + adapter_model.safetensors); loading reads the base by path
and puts the adapters back on it. The denoising schedule is the trainers' plain flow-matching one, not the
checkpoint's resolution-shifted schedule.
"""

from __future__ import annotations

import json
import string
from pathlib import Path

import torch
from torch import Tensor, nn

from posttrain.config import LoraConfig
from posttrain.recipes.image.settings import FlowModelConfig
from posttrain.errors import UserError
from posttrain.recipes.image.flow import CONDITION_CHANNELS, flow_backends

MAX_TEXT_TOKENS = 64  # T5 tokens per instruction (the pipelines allow up to 512; edit instructions are short)


class FluxEditModel(nn.Module):
    kind = "flux"

    def __init__(self, pipe, base: Path, image_size: int, guidance: float):
        super().__init__()
        scale = pipe.vae_scale_factor * 2  # VAE downsampling times the 2x2 packing
        if image_size % scale:
            raise UserError(f"flow.image_size {image_size} must be a multiple of {scale} for the FLUX checkpoint {base}")
        self.transformer, self.vae = pipe.transformer, pipe.vae
        self.text_encoder, self.text_encoder_2 = pipe.text_encoder, pipe.text_encoder_2
        for frozen in (self.transformer, self.vae, self.text_encoder, self.text_encoder_2):
            frozen.requires_grad_(False)
        self.pipe = pipe  # tokenizers, encode_prompt and the latent packing (a pipeline is not an nn.Module)
        self.base, self.image_size, self.guidance = Path(base).resolve(), image_size, guidance
        self.latent_channels = pipe.vae.config.latent_channels
        self.grid = image_size // scale  # packed tokens per side

    @property
    def has_adapters(self) -> bool:
        return hasattr(self.transformer, "peft_config")

    def train(self, mode: bool = True) -> "FluxEditModel":
        super().train(mode)
        for frozen in (self.vae, self.text_encoder, self.text_encoder_2):
            frozen.eval()  # frozen encoders never run dropout
        return self

    @torch.no_grad()
    def encode_text(self, texts: list[str]) -> tuple[Tensor, Tensor, Tensor]:
        embeds, pooled, text_ids = self.pipe.encode_prompt(list(texts), device=torch.device("cpu"), max_sequence_length=MAX_TEXT_TOKENS)
        return embeds, pooled, text_ids

    @torch.no_grad()
    def to_latent(self, images: Tensor) -> Tensor:
        """[B, 3, H, W] in [-1, 1] -> packed, scaled VAE latents [B, grid^2, 4 C] (the posterior mode)."""
        latents = self.pipe._encode_vae_image(images, generator=None)
        return self.pipe._pack_latents(latents, images.shape[0], self.latent_channels, latents.shape[2], latents.shape[3])

    @torch.no_grad()
    def from_latent(self, latents: Tensor) -> Tensor:
        spatial = self.pipe._unpack_latents(latents, self.image_size, self.image_size, self.pipe.vae_scale_factor)
        spatial = spatial / self.vae.config.scaling_factor + self.vae.config.shift_factor
        return self.vae.decode(spatial, return_dict=False)[0]

    def encode_conditions(self, conditions: Tensor) -> Tensor:
        """[B, 9, H, W] (S_new, A_old, A_new) -> their packed latents, appended as tokens [B, 3 grid^2, 4 C]."""
        images = conditions.view(conditions.shape[0], CONDITION_CHANNELS // 3, 3, *conditions.shape[-2:])
        return torch.cat([self.to_latent(images[:, k]) for k in range(images.shape[1])], dim=1)

    def latent_shape(self, n: int) -> tuple[int, ...]:
        return (n, self.grid * self.grid, 4 * self.latent_channels)

    def _image_ids(self, n_images: int, dtype: torch.dtype) -> Tensor:
        ids = self.pipe._prepare_latent_image_ids(1, self.grid, self.grid, torch.device("cpu"), dtype)
        return torch.cat([ids + torch.tensor([float(k), 0.0, 0.0], dtype=dtype) for k in range(n_images)], dim=0)

    def forward(self, x: Tensor, sigma: Tensor, conditions: Tensor, text: tuple[Tensor, Tensor, Tensor]) -> Tensor:
        """Velocity on the target tokens [B, grid^2, 4 C] at noise level sigma [B] (or a scalar)."""
        embeds, pooled, text_ids = text
        sigma = torch.as_tensor(sigma, dtype=x.dtype, device=x.device).expand(x.shape[0])
        guidance = torch.full_like(sigma, self.guidance) if self.transformer.config.guidance_embeds else None
        tokens = torch.cat([x, conditions], dim=1)
        out = self.transformer(
            hidden_states=tokens, timestep=sigma, guidance=guidance, pooled_projections=pooled, encoder_hidden_states=embeds,
            txt_ids=text_ids, img_ids=self._image_ids(tokens.shape[1] // x.shape[1], x.dtype), return_dict=False,
        )[0]
        return out[:, : x.shape[1]]

    def add_lora(self, cfg: LoraConfig) -> "FluxEditModel":
        from peft import LoraConfig as PeftLoraConfig
        from peft import get_peft_model

        peft_cfg = PeftLoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules=list(cfg.target_modules))
        self.transformer = get_peft_model(self.transformer, peft_cfg)
        return self

    def save(self, out: Path) -> None:
        """flow_config.json + the LoRA adapters; the base checkpoint stays where it is and is referenced."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        self.transformer.save_pretrained(out / "transformer_lora")
        meta = {"kind": self.kind, "base": str(self.base), "image_size": self.image_size, "guidance": self.guidance}
        (out / "flow_config.json").write_text(json.dumps(meta) + "\n")


def _read_checkpoint(path: Path):
    from diffusers import FluxKontextPipeline

    if not (path / "model_index.json").is_file():
        raise UserError(f"{path} is not a diffusers FLUX checkpoint directory (no model_index.json)")
    return FluxKontextPipeline.from_pretrained(path)


class FluxBackend:
    """`flow.kind: flux`: flow_sft starts from the checkpoint at `flow.path`; flow_rl / flow_eval load saved adapters."""

    @staticmethod
    def start(cfg: FlowModelConfig, image_size: int) -> FluxEditModel:
        return FluxEditModel(_read_checkpoint(Path(cfg.path)), Path(cfg.path), image_size, cfg.flux_guidance)

    @staticmethod
    def load(path: str | Path) -> FluxEditModel:
        from peft import PeftModel

        path = Path(path)
        meta = json.loads((path / "flow_config.json").read_text())
        base = Path(meta["base"])
        if not base.is_dir():
            raise UserError(f"{path} holds LoRA adapters for the FLUX checkpoint {base}, which is not there any more")
        model = FluxEditModel(_read_checkpoint(base), base, meta["image_size"], meta["guidance"])
        model.transformer = PeftModel.from_pretrained(model.transformer, path / "transformer_lora", is_trainable=True)
        return model


flow_backends.register("flux", needs_checkpoint=True, needs_lora=True)(FluxBackend)


def write_tiny_flux_checkpoint(out: Path, seed: int = 0) -> Path:
    """A tiny FLUX-family checkpoint built from configs (a few 10k parameters, tokenizers over a closed word
    list, no download), saved by `FluxKontextPipeline.save_pretrained`: for tests and dry runs of `flow.kind: flux`."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxKontextPipeline, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer, T5Config, T5EncoderModel, T5TokenizerFast

    words = sorted(set(
        "remove add keep back the a building tree road on left right centre side and restore empty lot where is now "
        "narrow widen in to its former width scene exactly as it".split()))
    letters = list(string.ascii_lowercase)
    specials = ["<|startoftext|>", "<|endoftext|>"]
    clip_vocab = {t: i for i, t in enumerate(specials + letters + [c + "</w>" for c in letters] + [w + "</w>" for w in words])}
    clip_tokenizer = CLIPTokenizer(vocab=clip_vocab, merges=[], model_max_length=77)  # no merges: letter tokens
    t5_tokenizer = T5TokenizerFast(vocab=[("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -3.0)]
                                   + [("\u2581" + w, -1.0) for w in words] + [(c, -5.0) for c in letters],
                                   extra_ids=0, model_max_length=512)
    torch.manual_seed(seed)
    text_encoder = CLIPTextModel(CLIPTextConfig(
        vocab_size=len(clip_vocab), hidden_size=32, intermediate_size=37, num_attention_heads=4, num_hidden_layers=2,
        max_position_embeddings=77, projection_dim=32, bos_token_id=0, eos_token_id=1, pad_token_id=1))
    text_encoder_2 = T5EncoderModel(T5Config(
        vocab_size=t5_tokenizer.vocab_size, d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4, dropout_rate=0.0))
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
        block_out_channels=(8, 8), layers_per_block=1, latent_channels=4, norm_num_groups=4, sample_size=16,
        use_quant_conv=False, use_post_quant_conv=False, shift_factor=0.0609, scaling_factor=1.5035)
    transformer = FluxTransformer2DModel(
        patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=8, num_attention_heads=2,
        joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=(2, 2, 4), guidance_embeds=True)
    pipe = FluxKontextPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=text_encoder,
                               tokenizer=clip_tokenizer, text_encoder_2=text_encoder_2, tokenizer_2=t5_tokenizer, transformer=transformer)
    pipe.save_pretrained(out)
    return Path(out)
