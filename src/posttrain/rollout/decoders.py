"""Incremental decoders: prefill a prompt batch once, then advance one token per call.

`FastLlamaDecoder` runs Llama-family models (Llama, Qwen2) with a preallocated KV buffer and one SDPA
call per layer, calling the model's own submodules (so LoRA-wrapped projections work unchanged) but
skipping the per-token bookkeeping of `model.forward` (mask construction, cache objects, output
classes), which dominates decoding time for small models. `HFDecoder` is the generic fallback through
`model.forward` with a `DynamicCache`. Both share prompt work across a group: the prompt is encoded once
and its keys/values repeated for the G samples.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import DynamicCache, PreTrainedModel


def positions_from_mask(mask: Tensor) -> Tensor:
    """Position ids for left-padded rows: 0 at the first real token (pads get 0 too)."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def unwrap(model: PreTrainedModel) -> PreTrainedModel:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


class HFDecoder:
    """Any causal LM, through `model.forward` with a KV cache."""

    def __init__(self, model: PreTrainedModel):
        self.model = model

    def prefill(self, ids: Tensor, mask: Tensor, repeat: int, max_new_tokens: int) -> Tensor:
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions_from_mask(mask), use_cache=True, logits_to_keep=1)
        self.cache: DynamicCache = out.past_key_values
        self.cache.batch_repeat_interleave(repeat)
        self.mask = torch.ones(ids.shape[0] * repeat, ids.shape[1] + max_new_tokens, dtype=mask.dtype, device=ids.device)
        self.mask[:, : ids.shape[1]] = mask.repeat_interleave(repeat, 0)
        self.length = ids.shape[1]
        self.position = positions_from_mask(mask)[:, -1:].repeat_interleave(repeat, 0)
        return out.logits[:, -1].float().repeat_interleave(repeat, 0)

    def step(self, token: Tensor) -> Tensor:
        self.length += 1
        self.position = self.position + 1
        out = self.model(
            input_ids=token[:, None], attention_mask=self.mask[:, : self.length], position_ids=self.position, cache=self.cache, use_cache=True
        )
        return out.logits[:, -1].float()


class FastLlamaDecoder:
    """Llama-family decoding with a static KV buffer; numerically the same as `model.forward`."""

    SUPPORTED = ("llama", "qwen2")

    @classmethod
    def supports(cls, model: PreTrainedModel) -> bool:
        cfg = unwrap(model).config
        rope = (getattr(cfg, "rope_parameters", None) or {}).get("rope_type", "default")
        sliding = any(t != "full_attention" for t in (getattr(cfg, "layer_types", None) or []))
        return cfg.model_type in cls.SUPPORTED and rope == "default" and cfg.hidden_act == "silu" and not sliding

    def __init__(self, model: PreTrainedModel):
        lm = unwrap(model)
        cfg = lm.config
        self.lm, self.body = lm, lm.model
        self.n_heads, self.n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads

    def _rope(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        rotary = self.body.rotary_emb
        freqs = positions[..., None].float() * rotary.inv_freq.float()
        emb = torch.cat((freqs, freqs), dim=-1)
        scale = rotary.attention_scaling
        return (emb.cos() * scale).to(dtype)[:, None], (emb.sin() * scale).to(dtype)[:, None]

    @staticmethod
    def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin

    def _layers(self, x: Tensor, positions: Tensor, attn_mask: Tensor | None, write_at: int, causal: bool = False) -> Tensor:
        """Run every decoder layer on `x` [N, L, H]; keys/values are written at [write_at, write_at + L).
        Attention follows `attn_mask` (True = may attend) or, when it is None, `causal`."""
        n, length, _ = x.shape
        cos, sin = self._rope(positions, x.dtype)
        end = write_at + length
        for i, layer in enumerate(self.body.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = attn.q_proj(h).view(n, length, self.n_heads, self.head_dim).transpose(1, 2)
            k = attn.k_proj(h).view(n, length, self.n_kv, self.head_dim).transpose(1, 2)
            v = attn.v_proj(h).view(n, length, self.n_kv, self.head_dim).transpose(1, 2)
            q, k = self._rotate(q, cos, sin), self._rotate(k, cos, sin)
            self.keys[i][:n, :, write_at:end] = k
            self.values[i][:n, :, write_at:end] = v
            out = F.scaled_dot_product_attention(
                q, self.keys[i][:n, :, :end], self.values[i][:n, :, :end], attn_mask=attn_mask, is_causal=causal and attn_mask is None,
                scale=attn.scaling, enable_gqa=True,
            )
            x = x + attn.o_proj(out.transpose(1, 2).reshape(n, length, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return x

    def _logits(self, x: Tensor) -> Tensor:
        return self.lm.lm_head(self.body.norm(x)).float()

    def prefill(self, ids: Tensor, mask: Tensor, repeat: int, max_new_tokens: int) -> Tensor:
        b, p = ids.shape
        rows = b * repeat
        capacity = p + max_new_tokens
        dtype, device = self.lm.lm_head.weight.dtype, ids.device
        self.keys = [torch.empty(rows, self.n_kv, capacity, self.head_dim, dtype=dtype, device=device) for _ in self.body.layers]
        self.values = [torch.empty_like(k) for k in self.keys]
        valid = mask.bool()
        self.padded = not bool(valid.all())
        causal = torch.ones(p, p, dtype=torch.bool, device=device).tril()
        # a left-pad query sees no real key; letting it see itself keeps softmax finite (its output is unused)
        allowed = (causal & valid[:, None, :]) | torch.eye(p, dtype=torch.bool, device=device)
        positions = positions_from_mask(mask)
        x = self._layers(self.body.embed_tokens(ids), positions, allowed[:, None] if self.padded else None, 0, causal=True)
        # share the prompt's keys/values across the group: copy rows b -> b*repeat .. b*repeat+repeat-1
        for cache in (*self.keys, *self.values):
            cache[:rows, :, :p] = cache[:b, :, :p].repeat_interleave(repeat, 0)
        self.key_valid = torch.ones(rows, capacity, dtype=torch.bool, device=device)
        self.key_valid[:, :p] = valid.repeat_interleave(repeat, 0)
        self.length = p
        self.position = positions[:, -1:].repeat_interleave(repeat, 0)
        return self._logits(x[:, -1]).repeat_interleave(repeat, 0)

    def step(self, token: Tensor) -> Tensor:
        self.position = self.position + 1
        mask = self.key_valid[:, None, None, : self.length + 1] if self.padded else None
        x = self._layers(self.body.embed_tokens(token[:, None]), self.position, mask, self.length)
        self.length += 1
        return self._logits(x[:, -1])


def decoder_for(model: PreTrainedModel) -> FastLlamaDecoder | HFDecoder:
    return FastLlamaDecoder(model) if FastLlamaDecoder.supports(model) else HFDecoder(model)
