"""A native vision-language checkpoint (a transformers image-text-to-text model: LLaVA, Liu et al. 2023,
arXiv 2304.08485, and its kin) behind recipes/viskg/vlm.py's `VisionLanguage` interface, loaded by path the way real
checkpoints come:

    path/  config.json + weights          AutoModelForImageTextToText.from_pretrained (LlavaForConditionalGeneration, ...)
           processor_config.json, tokenizer files, chat template     AutoProcessor.from_pretrained: the image processor,
                                           a tokenizer holding the image token, the chat template

A question becomes one user turn `[image, text]` through the processor's chat template (with the assistant's
generation prompt); the processor expands the image placeholder into the vision tower's number of image tokens, and
the model splices the projected patch features in at those positions (LLaVA §4.1, the same soft tokens as the tiny
model's, placed by the checkpoint's own template). Prompts are left-padded; positions count real tokens only, in the
full forward and in KV-cached sampling alike (the rollout engine, rollout/decode.py), so the log-probs of a
sampled completion are those it was sampled under. Images are uint8 [B, S, S, 3]; the image processor resizes and
normalises them to the tower's resolution. Tested on a tiny LLaVA (CLIP vision tower + Llama text model) built by
`tiny_llava`; models whose text positions are multimodal (Qwen2-VL's M-RoPE) need their own position ids and are
not covered here.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor, nn

from posttrain.errors import UserError
from posttrain.models.decoders import positions_from_mask
from posttrain.models.soft_tokens import sampled_logp
from posttrain.rollout.decode import Samples, sample

IMAGE_TOKEN = "<image>"
# Qwen2's turn markers (models/tokenizer.py's CHAT_TEMPLATE) over content lists: an image part is the processor's
# placeholder, a text part its text; string contents pass through (system prompts, SFT targets)
LLAVA_CHAT_TEMPLATE = (
    "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for part in message['content'] %}"
    "{%- if part['type'] == 'image' %}{{- '" + IMAGE_TOKEN + "' }}{%- elif part['type'] == 'text' %}{{- part['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}{{- '<|im_end|>\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)


def image_text_to_text_types() -> set[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    return set(MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES)


def check_checkpoint(path: Path) -> None:
    """One `UserError` line unless `path` is a directory holding an image-text-to-text checkpoint and a processor."""
    if not path.is_dir():
        raise UserError(f"vision-language model not found: {path} is not a directory")
    if not (path / "config.json").is_file():
        raise UserError(f"not a vision-language model: {path} has neither vlm.json (a VisionLanguageModel directory) nor config.json "
                        "(a transformers image-text-to-text checkpoint)")
    model_type = json.loads((path / "config.json").read_text()).get("model_type")
    if model_type not in image_text_to_text_types():
        raise UserError(f"not a vision-language model: {path} holds a {model_type!r} checkpoint, not an image-text-to-text one "
                        "(llava, idefics3, qwen2_vl, ...); a text-only causal LM takes a fresh patch encoder through "
                        "viskg.model.language_model")
    if not (path / "processor_config.json").is_file() and not (path / "preprocessor_config.json").is_file():
        raise UserError(f"not a usable vision-language model: {path} has no processor_config.json or preprocessor_config.json "
                        "(save the checkpoint's processor next to it: processor.save_pretrained)")


class NativeVLM(nn.Module):
    """An image-text-to-text model and its processor (see the module docstring)."""

    def __init__(self, model, processor):
        super().__init__()
        self.model, self.processor, self.tokenizer = model, processor, processor.tokenizer
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.tokenizer.padding_side = "left"  # every completion starts at one column
        if not getattr(self.tokenizer, "chat_template", None) and not getattr(processor, "chat_template", None):
            raise UserError("the vision-language checkpoint's processor has no chat template (its prompt format is unknown)")

    @classmethod
    def load(cls, path: str | Path, dtype: str = "float32") -> "NativeVLM":
        from transformers import AutoModelForImageTextToText, AutoProcessor

        from posttrain.models.factory import readable

        path = Path(path)
        check_checkpoint(path)
        with readable(path, "vision-language model"):
            processor = AutoProcessor.from_pretrained(path)
            model = AutoModelForImageTextToText.from_pretrained(path, dtype=getattr(torch, dtype))
        if getattr(processor, "image_processor", None) is None:
            raise UserError(f"not a usable vision-language model: the processor at {path} has no image processor")
        return cls(model, processor)

    def save(self, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(out)
        self.processor.save_pretrained(out)

    # -- the VisionLanguage interface ------------------------------------------------------------------------
    def encode_prompts(self, texts: list[str], images: Tensor) -> tuple[Tensor, Tensor]:
        """One user turn [image, question] per row through the chat template; the processor expands the image token."""
        turns = [[{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": t}]}] for t in texts]
        prompts = [self.processor.apply_chat_template(turn, add_generation_prompt=True, tokenize=False) for turn in turns]
        enc = self.processor(text=prompts, images=list(images.cpu().numpy()), return_tensors="pt", padding=True)
        return enc["input_ids"], enc["attention_mask"]

    def pixels(self, images: Tensor) -> dict[str, Tensor]:
        """The image processor's model inputs (pixel_values, and whatever else the architecture reads) for uint8 images."""
        out = self.processor.image_processor(list(images.cpu().numpy()), return_tensors="pt")
        device, dtype = self.model.device, self.model.dtype
        return {k: (v.to(device, dtype) if v.is_floating_point() else v.to(device)) for k, v in out.items() if isinstance(v, Tensor)}

    def completion_logp(self, images: Tensor, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor,
                        completion_mask: Tensor, temperature: float = 1.0) -> Tensor:
        """The prompt's forward (the pixel values spliced in at its image tokens), then the completion's over its cache,
        as sampling reads them: an image token the policy sampled is a plain token, not a placeholder for features."""
        width = prompt_ids.shape[1]
        mask = torch.cat([prompt_mask, completion_mask.to(prompt_mask.dtype)], dim=1)
        positions = positions_from_mask(mask)
        prompt = self.model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=positions[:, :width], use_cache=True,
                            **self.pixels(images))
        rest = self.model(input_ids=completion_ids, attention_mask=mask, position_ids=positions[:, width:],
                          past_key_values=prompt.past_key_values).logits
        logits = torch.cat([prompt.logits[:, -1:], rest[:, :-1]], dim=1)
        return sampled_logp(logits if temperature == 1.0 else logits / temperature, completion_ids, completion_mask)

    @torch.no_grad()
    def sample(self, images: Tensor, prompt_ids: Tensor, prompt_mask: Tensor, max_new_tokens: int, temperature: float,
               generator: torch.Generator | None = None) -> Samples:
        """One completion per row (temperature 0: greedy); the pixel values enter the prompt's forward only."""
        return sample(
            self.model, prompt_ids, prompt_mask, prompt_inputs=self.pixels(images), group_size=1, max_new_tokens=max_new_tokens,
            eos_id=self.tokenizer.eos_token_id, pad_id=self.tokenizer.pad_token_id, temperature=temperature if temperature > 0 else 1.0,
            greedy=temperature <= 0, generator=generator,
        )

    def generate(self, images: Tensor, prompt_ids: Tensor, prompt_mask: Tensor, max_new_tokens: int, temperature: float,
                 generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        samples = self.sample(images, prompt_ids, prompt_mask, max_new_tokens, temperature, generator)
        return samples.completion_ids, samples.completion_mask


def tiny_llava(corpus: list[str], image_size: int, patch_size: int, hidden_size: int, layers: int, heads: int, vocab_size: int = 400):
    """(a fresh LlavaForConditionalGeneration, its LlavaProcessor): a CLIP vision tower and a Llama text model built
    from a config, a byte-level BPE tokenizer learnt from `corpus` with the image token added, the chat template above
    and a CLIP image processor at `image_size` -- a checkpoint shaped like the real ones, for tests and experiments."""
    from transformers import LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    from posttrain.models.image_text import CLIP_MEAN, CLIP_STD
    from posttrain.models.tokenizer import train_bpe_tokenizer

    tokenizer = train_bpe_tokenizer(corpus, vocab_size=vocab_size, chat_template=LLAVA_CHAT_TEMPLATE)
    tokenizer.add_tokens([IMAGE_TOKEN], special_tokens=True)
    image_processor = CLIPImageProcessorPil(size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size},
                                            image_mean=list(CLIP_MEAN), image_std=list(CLIP_STD))
    # LLaVA-1.5's layout: CLIP's CLS token counted, then dropped ("default" feature selection), features of the
    # second-to-last vision layer
    processor = LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=patch_size, num_additional_image_tokens=1,
                               vision_feature_select_strategy="default", chat_template=LLAVA_CHAT_TEMPLATE)
    common = {"hidden_size": hidden_size, "intermediate_size": 2 * hidden_size, "num_hidden_layers": layers, "num_attention_heads": heads}
    config = LlavaConfig(
        vision_config={"model_type": "clip_vision_model", **common, "image_size": image_size, "patch_size": patch_size},
        text_config={"model_type": "llama", **common, "num_key_value_heads": heads, "vocab_size": len(tokenizer),
                     "max_position_embeddings": 512,
                     "pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.eos_token_id, "bos_token_id": None},
        image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN), image_seq_length=(image_size // patch_size) ** 2,
        vision_feature_select_strategy="default", vision_feature_layer=-2)
    return LlavaForConditionalGeneration(config), processor
