"""MotionInsight's evaluator (specs §30): a tiny video encoder whose outputs enter a causal language model as soft
tokens (the LLaVA recipe, Liu et al. 2023, arXiv 2304.08485: a projector maps visual features into the word
embedding space and they are prepended to the text), built from a config with a closed word vocabulary.

    per frame   maps [C, S, S] -> two stride-2 convolutions -> 2x2 average pool -> Linear -> d   (+ Linear(tracks) -> d)
    over time   a temporal convolution, then `soft_tokens` windows, each pooled by mean and max (an instant event,
                a teleport, survives the max) -> Linear -> the language model's hidden size
    text        [soft tokens] [prompt token] completion ...   (one Llama-shaped decoder reads both)

The same class reads the motion representation (flow + mask maps and object tracks) or RGB frames (3 channels,
no tracks): only `channels` and `track_dim` differ. `save` / `load` write and read a directory (evaluator.json,
model.safetensors, the tokenizer). The splice of the soft tokens before the prompt and the completion log-probs are
models/soft_tokens.py's, shared with VisKG's vision-language model, and sampling is the rollout engine's
(rollout/decode.py's `sample_soft_tokens`); the video encoder is this module's own (VisKG's is a patch encoder over one image).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase

from posttrain.errors import UserError
from posttrain.models.soft_tokens import SoftTokenLM, sampled_logp
from posttrain.rollout.decode import Samples, sample_soft_tokens

PROMPT = "causes"  # the token the completion follows (any vocabulary word: the soft tokens carry the input)


class VideoEncoder(nn.Module):
    def __init__(self, channels: int, track_dim: int, width: int, soft_tokens: int, out_dim: int):
        super().__init__()
        self.frame = nn.Sequential(nn.Conv2d(channels, width, 3, 2, 1), nn.GELU(), nn.Conv2d(width, width, 3, 2, 1), nn.GELU(),
                                   nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(4 * width, width))
        self.tracks = nn.Linear(track_dim, width) if track_dim else None
        self.temporal = nn.Conv1d(width, width, 3, padding=1)
        self.project = nn.Linear(2 * width, out_dim)
        self.soft_tokens = soft_tokens

    def forward(self, maps: Tensor, tracks: Tensor) -> Tensor:
        """maps [B, T, C, S, S], tracks [B, T, track_dim] -> soft tokens [B, soft_tokens, out_dim]."""
        B, T = maps.shape[:2]
        x = self.frame(maps.flatten(0, 1)).view(B, T, -1)
        if self.tracks is not None:
            x = x + self.tracks(tracks)
        x = F.gelu(self.temporal(x.transpose(1, 2)))  # [B, width, T]
        pooled = torch.cat([F.adaptive_avg_pool1d(x, self.soft_tokens), F.adaptive_max_pool1d(x, self.soft_tokens)], 1)
        return self.project(pooled.transpose(1, 2))


class MotionEvaluator(SoftTokenLM):
    """Video encoder -> soft tokens -> a tiny Llama decoder that writes the judgement (see the module docstring)."""

    def __init__(self, spec: dict, tokenizer: PreTrainedTokenizerBase):
        lm = LlamaConfig(vocab_size=len(tokenizer), hidden_size=spec["hidden_size"], intermediate_size=2 * spec["hidden_size"],
                         num_hidden_layers=spec["layers"], num_attention_heads=spec["heads"], num_key_value_heads=spec["heads"],
                         max_position_embeddings=64, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                         bos_token_id=None, tie_word_embeddings=True)
        language_model = LlamaForCausalLM(lm)  # built before the encoder: a seed gives the weights it always gave
        encoder = VideoEncoder(spec["channels"], spec["track_dim"], spec["encoder_width"], spec["soft_tokens"], spec["hidden_size"])
        super().__init__(encoder, language_model, tokenizer)
        self.spec = dict(spec)
        self.prompt_id = tokenizer.convert_tokens_to_ids(PROMPT)

    def prompt(self, n: int, device) -> tuple[Tensor, Tensor]:
        """(ids [n, 1], mask [n, 1]) of the one prompt token the judgement follows."""
        ids = torch.full((n, 1), self.prompt_id, dtype=torch.long, device=device)
        return ids, torch.ones_like(ids)

    def prefix(self, maps: Tensor, tracks: Tensor) -> Tensor:
        """[B, soft_tokens + 1, H]: the soft tokens and the prompt token's embedding."""
        soft = self.encoder(maps, tracks)
        return self.splice(soft, *self.prompt(len(soft), soft.device))[0]

    def token_logits(self, maps: Tensor, tracks: Tensor, completion: Tensor) -> Tensor:
        """[B, L, V] logits of each completion token [B, L] given the video and the tokens before it."""
        prompt = self.prompt(len(maps), maps.device)
        return self.completion_logits(self.encoder(maps, tracks), *prompt, completion, torch.ones_like(completion))

    def token_logp(self, maps: Tensor, tracks: Tensor, completion: Tensor) -> Tensor:
        """[B, L] log-probability of each completion token."""
        return sampled_logp(self.token_logits(maps, tracks, completion), completion, torch.ones_like(completion))

    @torch.no_grad()
    def sample(self, maps: Tensor, tracks: Tensor, max_new_tokens: int, temperature: float = 0.0,
               generator: torch.Generator | None = None) -> Samples:
        """One judgement per video from the rollout engine, each token's log-prob recorded. Greedy at temperature 0."""
        return sample_soft_tokens(self, self.encoder(maps, tracks), *self.prompt(len(maps), maps.device), max_new_tokens, temperature,
                                  generator)

    def generate(self, maps: Tensor, tracks: Tensor, max_new_tokens: int, temperature: float = 0.0,
                 generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """(completion ids [B, L], mask [B, L]: 1 up to and including the end-of-text token) of `sample`."""
        samples = self.sample(maps, tracks, max_new_tokens, temperature, generator)
        return samples.completion_ids, samples.completion_mask

    def decode(self, ids: Tensor, mask: Tensor) -> list[str]:
        eos = self.tokenizer.eos_token_id
        return [self.tokenizer.decode([t for t, m in zip(row.tolist(), keep.tolist()) if m and t != eos]) for row, keep in zip(ids, mask)]

    def save(self, out: Path) -> None:
        from safetensors.torch import save_model

        out.mkdir(parents=True, exist_ok=True)
        save_model(self, str(out / "model.safetensors"))
        (out / "evaluator.json").write_text(json.dumps(self.spec, indent=1, sort_keys=True) + "\n")
        self.tokenizer.save_pretrained(out)

    @classmethod
    def load(cls, path: Path | str) -> "MotionEvaluator":
        from safetensors.torch import load_model

        path = Path(path)
        if not (path / "evaluator.json").is_file():
            raise UserError(f"motion evaluator not found: {path} has no evaluator.json (the model/ of a motion_sft or motion_grpo output)")
        model = cls(json.loads((path / "evaluator.json").read_text()), AutoTokenizer.from_pretrained(path))
        load_model(model, str(path / "model.safetensors"))
        return model
