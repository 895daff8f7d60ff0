"""Incremental decoders: prefill a prompt batch once, then advance one token per call.

`FastLlamaDecoder` runs Llama-family models (Llama, Qwen2) with a preallocated KV buffer and one SDPA
call per layer, calling the model's own submodules (so LoRA-wrapped projections work unchanged) but
skipping the per-token bookkeeping of `model.forward` (mask construction, cache objects, output
classes), which dominates decoding time for small models. Where the projections are plain `nn.Linear`,
q/k/v and gate/up are fused into one matmul each for the (gradient-free) decode loop, and on the CPU every plain
projection and the head are blocked once for oneDNN (models/packed.py). These copies are kept while the parameters
are unchanged (a decoder reused across prefills prepares them once) and made again at the next step when they change
(an asynchronous worker loads newer weights between decode steps). `HFDecoder` is the
generic fallback through `model.forward` with a `DynamicCache`. Both share prompt work across a group:
the prompt is encoded once and its keys/values repeated for the G samples. Both prefill from token ids or from
`embeds` (soft-token models splice encoder outputs into the word embeddings), and `select(index)` keeps and reorders
rows of the state (beam search). Positions count real tokens only (`positions_from_mask`): a left-padded row sees
the positions an unpadded one does, in the prompt and in every decode step. The rollout engine (rollout/decode.py)
drives them.

With `static=True` (`prefill(..., static=True)`) every decode step has the same shapes and no host sync: keys and
values are written at a position held in a device tensor and each step attends over the whole KV buffer with
the positions not yet written masked out. On CUDA that step is captured once as a CUDA graph and replayed for
every token (one launch instead of a few hundred small kernels per token); elsewhere it runs eagerly, which is
how the CPU tests check it against the plain step.

With `model.sampler_dtype` (`use_sampler_dtype`) the decode loop of a Llama-family model whose layers are all plain
runs in that dtype: each prefill casts the weights it reads once (the fused q/k/v and gate/up, the output and down
projections, the norms, the embedding and the head), the KV buffer and every matmul are in that dtype, and the logits
are returned in float32. The model's own weights, the training forward and its gradient stay in `model.dtype`: the
sampler then differs from the trainer by the cast, which the RL step measures (`mismatch/k3`) like any
sampler-trainer gap. A model the fast decoder does not run, or one with LoRA-wrapped layers, samples in its own dtype.

`FastLlamaDecoder.completion_logits` applies the same sharing to the training forward pass: when G
rows share a prompt, the prompt is encoded once (with gradient) and the G completions attend to its
keys/values, so the prompt tokens cost 1/G of a plain `model.forward` over `prompt + completion`.

Attention is one call, `attention`: SDPA on an accelerator, and on the CPU wherever its kernel is the faster one
(float32 training forwards); elsewhere on the CPU (every decode step, and the bf16/fp16 training forward) two
grouped matmuls around a float32 softmax, the arithmetic of transformers' eager attention. PyTorch's CPU flash
kernel is slow at those shapes: a one-token query against 84 keys (64 rows, 9 query / 3 KV heads, head size 64) took
5.1 ms in bf16 against 0.35 ms for the matmuls on one AVX512-BF16 core (0.77 against 0.59 ms in float32), and a bf16
training forward and backward over 4 rows x 64 tokens 6.6 ms against 2.6 ms.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import DynamicCache, PreTrainedModel

from posttrain.models import packed


CUDA_GRAPHS = "posttrain_cuda_graphs"  # model attribute set by `use_cuda_graphs`, read by the rollout engine
SAMPLER_DTYPE = "posttrain_sampler_dtype"  # model attribute set by `use_sampler_dtype`, read by FastLlamaDecoder


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float, causal: bool = False) -> Tensor:
    """Scaled dot-product attention of q [N, Hq, Lq, D] over k, v [N, Hkv, Lk, D] (Hq a multiple of Hkv, query heads
    grouped by KV head as in GQA), under `mask` ([N or 1, 1, Lq, Lk], True = may attend) or, when it is None and
    `causal`, SDPA's causal mask (query i sees keys 0..i). See the module docstring for which kernel runs where."""
    if q.device.type != "cpu" or (q.shape[-2] > 1 and q.dtype == torch.float32):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None, scale=scale, enable_gqa=True)
    n, heads, length, dim = q.shape
    groups, keys = k.shape[1], k.shape[-2]
    rep = heads // groups
    if mask is None and causal and length > 1:
        mask = torch.ones(length, keys, dtype=torch.bool, device=q.device).tril()[None, None]
    scores = torch.matmul(q.reshape(n, groups, rep * length, dim), k.transpose(-1, -2)) * scale  # [N, Hkv, rep * Lq, Lk]
    if mask is not None:  # rows of scores run over (query head in group, query): tile the mask's query rows per head
        if length > 1:
            mask = mask.expand(mask.shape[0], 1, length, keys).repeat(1, 1, rep, 1)
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype)
    return torch.matmul(probs, v).reshape(n, heads, length, dim)


def use_cuda_graphs(model: PreTrainedModel, enabled: bool) -> None:
    """Make the rollout engine replay the model's decode steps as CUDA graphs (`model.cuda_graphs`), where it can: a
    Llama-family model on a CUDA device without autocast (autocast's weight cache cannot be captured)."""
    setattr(unwrap(model), CUDA_GRAPHS, enabled)


def use_sampler_dtype(model: PreTrainedModel, dtype: torch.dtype | str | None) -> None:
    """Make the fast decoder sample in `dtype` (`model.sampler_dtype`, a torch dtype or its name; None: the weights'
    own dtype), from a cast of the weights taken at each prefill; training is unaffected."""
    setattr(unwrap(model), SAMPLER_DTYPE, getattr(torch, dtype) if isinstance(dtype, str) else dtype)


def positions_from_mask(mask: Tensor) -> Tensor:
    """Position ids for left-padded rows: 0 at the first real token (pads get 0 too)."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def unwrap(model: PreTrainedModel) -> PreTrainedModel:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def sharded(model: PreTrainedModel) -> bool:
    """An FSDP2-sharded model (training.sharding: fsdp): between forwards its units hold weight shards, which their
    forward hooks gather. Code that calls its submodules directly (these decoders, the shared-prompt forward) goes
    around those hooks, so it runs only while the caller holds the weights gathered (trainers/distributed.gathered)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(unwrap(model), FSDPModule)


class HFDecoder:
    """Any causal LM, through `model.forward` with a KV cache."""

    def __init__(self, model: PreTrainedModel):
        self.model = model

    def prefill(self, ids: Tensor | None, mask: Tensor, repeat: int, max_new_tokens: int, embeds: Tensor | None = None,
                **inputs: Tensor) -> Tensor:
        """`inputs`: further model inputs of the prompt (a native image-text model's pixel values)."""
        inputs.update({"input_ids": ids} if embeds is None else {"inputs_embeds": embeds})
        self.cache = DynamicCache()
        out = self.model(**inputs, attention_mask=mask, position_ids=positions_from_mask(mask), cache=self.cache, use_cache=True, logits_to_keep=1)
        self.cache.batch_repeat_interleave(repeat)
        b, p = mask.shape
        self.mask = torch.ones(b * repeat, p + max_new_tokens, dtype=mask.dtype, device=mask.device)
        self.mask[:, :p] = mask.repeat_interleave(repeat, 0)
        self.length = p
        self.position = positions_from_mask(mask)[:, -1:].repeat_interleave(repeat, 0)
        return out.logits[:, -1].float().repeat_interleave(repeat, 0)

    def step(self, token: Tensor) -> Tensor:
        self.length += 1
        self.position = self.position + 1
        out = self.model(
            input_ids=token[:, None], attention_mask=self.mask[:, : self.length], position_ids=self.position, cache=self.cache, use_cache=True
        )
        return out.logits[:, -1].float()

    def select(self, index: Tensor) -> None:
        """Keep rows `index` [N'] of the state, in that order (a beam's surviving hypotheses)."""
        self.cache.reorder_cache(index)
        self.mask, self.position = self.mask[index], self.position[index]

    def resume(self, keys: list[Tensor], values: list[Tensor], mask: Tensor, max_new_tokens: int) -> None:
        """Continue from given keys/values (per layer [N, Hkv, S, D]; none for an empty prefix) of tokens under `mask`
        [N, S] (0 on padding): the next `step` feeds the token after them."""
        self.cache = DynamicCache(list(zip(keys, values))) if keys else DynamicCache()
        n, s = mask.shape
        self.mask = torch.ones(n, s + max_new_tokens, dtype=mask.dtype, device=mask.device)
        self.mask[:, :s] = mask
        self.length = s
        self.position = mask.long().sum(-1, keepdim=True) - 1

    def row_cache(self, row: int, start: int, end: int) -> tuple[list[Tensor], list[Tensor]]:
        """Keys and values (per layer [Hkv, end - start, D]) of row `row` at buffer columns [start, end)."""
        layers = self.cache.layers
        return [layer.keys[row, :, start:end] for layer in layers], [layer.values[row, :, start:end] for layer in layers]


def _unhooked(module: nn.Module) -> bool:
    """No forward, forward-pre or backward hooks on `module`: code may use its weight without calling it."""
    return not (module._forward_hooks or module._forward_pre_hooks or module._backward_hooks or module._backward_pre_hooks)


def _plain(*modules: nn.Module) -> bool:
    """True when every module is an unwrapped `nn.Linear` (a LoRA wrapper is not) without hooks, so the decode loop
    can use a copy of its weight (fused, cast, blocked) instead of calling it: a hooked module (the speed benchmark's
    EOS-off hook on the head, a user's probe) is called, and its hooks run."""
    return all(type(m) is nn.Linear and _unhooked(m) for m in modules)


def _projections(layer: nn.Module) -> tuple[nn.Module, ...]:
    attn, mlp = layer.self_attn, layer.mlp
    return attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj


def _rms(weight: Tensor, eps: float, x: Tensor) -> Tensor:
    """The Llama-family RMSNorm at x's dtype: normalised in float32, cast back, then scaled by `weight`."""
    return weight * F.rms_norm(x.float(), (x.shape[-1],), None, eps).to(x.dtype)


def _fuse(*linears: nn.Linear) -> tuple[Tensor, Tensor | None]:
    weight = torch.cat([m.weight for m in linears], dim=0)
    if all(m.bias is None for m in linears):
        return weight, None
    bias = torch.cat([m.bias if m.bias is not None else m.weight.new_zeros(m.out_features) for m in linears])
    return weight, bias


class FastLlamaDecoder:
    """Llama-family decoding with a static KV buffer; numerically the same as `model.forward`."""

    SUPPORTED = ("llama", "qwen2")

    @classmethod
    def supports(cls, model: PreTrainedModel) -> bool:
        cfg = unwrap(model).config
        rope = (getattr(cfg, "rope_parameters", None) or {}).get("rope_type", "default")
        sliding = any(t != "full_attention" for t in (getattr(cfg, "layer_types", None) or []))
        dropout = getattr(cfg, "attention_dropout", 0.0) or 0.0
        return cfg.model_type in cls.SUPPORTED and rope == "default" and cfg.hidden_act == "silu" and not sliding and dropout == 0.0

    def __init__(self, model: PreTrainedModel):
        lm = unwrap(model)
        cfg = lm.config
        self.lm, self.body = lm, lm.model
        self.n_heads, self.n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.fused: list[dict[str, Tensor | None]] = []
        self.cast: dict[str, Tensor] = {}  # the sampler-dtype copies of the embedding, final norm and head (else empty)
        self.dtype = lm.lm_head.weight.dtype  # the decode loop's dtype (set by `_fuse_weights`)
        self.head: Tensor | None = None  # the decode loop's head weight (cast, blocked), None: the model's lm_head
        self._fused_key: tuple | None = None  # the parameters and dtype `fused`/`cast`/`head` were made from
        self._params = list(lm.parameters())  # read at every step for that key (60 us at 135M, against 1 ms through `parameters()`)

    # -- shared pieces -------------------------------------------------------------------------------

    def _rope(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos/sin [..., 1, D] for `positions` [...], as the model's rotary embedding computes them."""
        rotary = self.body.rotary_emb
        freqs = positions[..., None].float() * rotary.inv_freq.float()
        emb = torch.cat((freqs, freqs), dim=-1)
        scale = rotary.attention_scaling
        return (emb.cos() * scale).to(dtype)[..., None, :], (emb.sin() * scale).to(dtype)[..., None, :]

    @staticmethod
    def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin

    @staticmethod
    def _norm(module: nn.Module, x: Tensor) -> Tensor:
        # one fused kernel instead of the module's six ops; the same float32 math
        if x.dtype == torch.float32 and type(module).__name__.endswith("RMSNorm"):
            return F.rms_norm(x, module.weight.shape, module.weight, module.variance_epsilon)
        return module(x)

    def _layer_norm(self, i: int, which: str, module: nn.Module, x: Tensor) -> Tensor:
        """RMSNorm `module` of layer `i` (`which`: "input" or "post"), from its sampler-dtype copy when there is one
        (the model's own math: normalised in float32, cast back, then scaled)."""
        weight = self.fused[i].get(which) if self.fused else None
        return self._norm(module, x) if weight is None else _rms(weight, module.variance_epsilon, x)

    def _linear(self, i: int, name: str, module: nn.Module, x: Tensor) -> Tensor:
        """Projection `module` of layer `i`, from the decode loop's copy (`name`, `name`_bias: cast, blocked) when there is one."""
        weight = self.fused[i].get(name) if self.fused else None
        return module(x) if weight is None else packed.linear(x, weight, self.fused[i].get(f"{name}_bias"))

    def _embed(self, ids: Tensor) -> Tensor:
        return self.body.embed_tokens(ids) if "embed" not in self.cast else F.embedding(ids, self.cast["embed"])

    def _attention_inputs(self, i: int, layer: nn.Module, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Rotated q [..., Hq, D], k [..., Hkv, D] and v [..., Hkv, D] of layer `i` for its residual input x [..., H]."""
        h = self._layer_norm(i, "input", layer.input_layernorm, x)
        heads = (self.n_heads, self.n_kv, self.n_kv)
        fused = self.fused[i]["qkv"] if self.fused else None
        if fused is not None:
            qkv = packed.linear(h, fused, self.fused[i]["qkv_bias"]).unflatten(-1, (sum(heads), self.head_dim))
            qk, v = qkv[..., : self.n_heads + self.n_kv, :], qkv[..., self.n_heads + self.n_kv :, :]
        else:
            attn = layer.self_attn
            q, k, v = (proj(h).unflatten(-1, (count, self.head_dim)) for proj, count in zip((attn.q_proj, attn.k_proj, attn.v_proj), heads))
            qk = torch.cat([q, k], dim=-2)
        qk = self._rotate(qk, cos, sin)  # one rotation covers q and k
        return qk[..., : self.n_heads, :], qk[..., self.n_heads :, :], v

    def _mlp(self, i: int, layer: nn.Module, x: Tensor) -> Tensor:
        h = self._layer_norm(i, "post", layer.post_attention_layernorm, x)
        fused = self.fused[i]["gate_up"] if self.fused else None
        if fused is None:
            return layer.mlp(h)
        gate, up = packed.linear(h, fused).chunk(2, dim=-1)
        return self._linear(i, "down", layer.mlp.down_proj, F.silu(gate) * up)

    def _logits(self, x: Tensor) -> Tensor:
        h = _rms(self.cast["norm"], self.body.norm.variance_epsilon, x) if "norm" in self.cast else self._norm(self.body.norm, x)
        return (self.lm.lm_head(h) if self.head is None else packed.linear(h, self.head, self.head_bias)).float()

    # -- decoding (no gradient) ------------------------------------------------------------------------

    def _fuse_weights(self, rows: int = 64, autocast: bool | None = None) -> bool:
        """Concatenate q/k/v and gate/up weights of plain `nn.Linear` layers (LoRA-wrapped ones stay as they are);
        with a sampler dtype (`use_sampler_dtype`) and every projection plain, cast every weight the loop reads to it;
        on the CPU block every plain projection and the head for oneDNN (models/packed.py; `rows`: the loop's row
        count, a layout hint). Kept while the model's parameters are unchanged: a decoder reused for several prefills
        (the KV engine's continuations) prepares them once. `autocast`: whether the loop runs under autocast (default:
        whether it is on now), which leaves the weights unblocked. Returns whether they were made (again)."""
        own = self.lm.lm_head.weight.dtype
        want = getattr(self.lm, SAMPLER_DTYPE, None) or own
        if autocast is None:
            autocast = torch.is_autocast_enabled(self.lm.lm_head.weight.device.type)
        key = (want, autocast, *((p.data_ptr(), p._version) for p in self._params))
        if key == self._fused_key:
            return False
        projections = [m for layer in self.body.layers for m in _projections(layer)]
        cast = (want != own and _plain(*projections, self.lm.lm_head) and type(self.body.embed_tokens) is nn.Embedding
                and all(layer.mlp.gate_proj.bias is None and layer.mlp.up_proj.bias is None for layer in self.body.layers))  # gate/up fused
        to = (lambda t: None if t is None else t.to(want)) if cast else (lambda t: t)  # noqa: E731
        blocked = (lambda t: t) if key[1] else (lambda t: packed.pack(t, rows))  # noqa: E731  (autocast picks the matmul dtype per call)
        self.dtype, self.fused, self.cast, self.head = (want if cast else own), [], {}, None
        for layer in self.body.layers:
            attn, mlp = layer.self_attn, layer.mlp
            entry: dict[str, Tensor | None] = {"qkv": None, "qkv_bias": None, "gate_up": None}
            if _plain(attn.q_proj, attn.k_proj, attn.v_proj):
                weight, bias = _fuse(attn.q_proj, attn.k_proj, attn.v_proj)
                entry["qkv"], entry["qkv_bias"] = blocked(to(weight)), to(bias)
            if _plain(mlp.gate_proj, mlp.up_proj) and mlp.gate_proj.bias is None and mlp.up_proj.bias is None:
                entry["gate_up"] = blocked(to(_fuse(mlp.gate_proj, mlp.up_proj)[0]))
            for name, module in (("o", attn.o_proj), ("down", mlp.down_proj)):
                if _plain(module):
                    entry[name], entry[f"{name}_bias"] = blocked(to(module.weight)), to(module.bias)
            if cast:
                entry.update(input=to(layer.input_layernorm.weight), post=to(layer.post_attention_layernorm.weight))
            self.fused.append(entry)
        if cast:
            embed = self.body.embed_tokens.weight
            self.cast = {"embed": to(embed), "norm": to(self.body.norm.weight)}
        if _plain(self.lm.lm_head):
            head = self.cast["embed"] if cast and self.lm.lm_head.weight is self.body.embed_tokens.weight else to(self.lm.lm_head.weight)  # tied: one cast
            self.head, self.head_bias = blocked(head), to(self.lm.lm_head.bias)
        self._fused_key = key
        self.rows = rows
        return True

    def _layers(self, x: Tensor, cos: Tensor, sin: Tensor, attn_mask: Tensor | None, write_at: int, causal: bool = False,
                attend: int | None = None) -> Tensor:
        """Run every decoder layer on `x` [N, L, H] with rotary cos/sin [N, L, 1, D]; keys/values are written at
        [write_at, write_at + L). Attention covers buffer columns [0, attend) (default: up to the last written one) and
        follows `attn_mask` (True = may attend) or, when it is None, `causal`."""
        n, length, _ = x.shape
        end = write_at + length
        attend = end if attend is None else attend
        for i, layer in enumerate(self.body.layers):
            attn = layer.self_attn
            q, k, v = self._attention_inputs(i, layer, x, cos, sin)
            self.keys[i][:, :, write_at:end] = k.transpose(1, 2)
            self.values[i][:, :, write_at:end] = v.transpose(1, 2)
            out = attention(q.transpose(1, 2), self.keys[i][:n, :, :attend], self.values[i][:n, :, :attend], attn_mask, attn.scaling, causal)
            x = x + self._linear(i, "o", attn.o_proj, out.transpose(1, 2).reshape(n, length, -1))
            x = x + self._mlp(i, layer, x)
        return x

    def _buffers(self, rows: int, capacity: int, dtype: torch.dtype, device: torch.device, static: bool) -> None:
        """Allocate the KV buffers [rows, Hkv, capacity, D] per layer. The static step and a bf16/fp16 CPU decode step
        (`self.whole`) attend over all `capacity` columns with the unwritten ones masked out, so those must hold finite
        numbers (zeros), not garbage. On the CPU in bf16 that is the faster step: a column slice of the buffer is not
        contiguous and the batched bf16 matmul copies it in every layer (at the 135M shape, 64 rows, 2 threads: 81 against
        78 ms a step, medians of 4 x 64 steps); in float32 it reads the slice in place and the two are even (124 / 125 ms)."""
        self.whole = static or (device.type == "cpu" and dtype != torch.float32)
        new_buffer = torch.zeros if self.whole else torch.empty
        self.keys = [new_buffer(rows, self.n_kv, capacity, self.head_dim, dtype=dtype, device=device) for _ in self.body.layers]
        self.values = [new_buffer(rows, self.n_kv, capacity, self.head_dim, dtype=dtype, device=device) for _ in self.body.layers]
        self.slots = torch.arange(capacity, device=device)

    def prefill(self, ids: Tensor | None, mask: Tensor, repeat: int, max_new_tokens: int, static: bool = False,
                embeds: Tensor | None = None) -> Tensor:
        b, p = mask.shape
        rows = b * repeat
        capacity = p + max_new_tokens
        if not torch.is_grad_enabled():
            self._fuse_weights(rows)
        dtype, device = self.dtype, mask.device
        valid = mask.bool()
        self.padded = not bool(valid.all())
        positions = positions_from_mask(mask)
        # the prompt runs once per prompt row, into the first b rows of buffers sized for b * repeat rows
        self._buffers(rows, capacity, dtype, device, static)
        prompt_keys, prompt_values = self.keys, self.values
        self.keys, self.values = [k[:b] for k in prompt_keys], [v[:b] for v in prompt_values]
        cos, sin = self._rope(positions, dtype)
        x = self._layers(self._embed(ids) if embeds is None else embeds.to(self.dtype), cos, sin, _prompt_mask(valid)[:, None] if self.padded else None, 0, causal=True)
        self.keys, self.values = prompt_keys, prompt_values
        # share the prompt's keys/values across the group: rows b -> b*repeat .. b*repeat+repeat-1
        if repeat > 1:
            for cache in (*self.keys, *self.values):
                cache[:, :, :p] = cache[:b, :, :p].repeat_interleave(repeat, 0)
        if self.padded:
            self.key_valid = torch.ones(rows, capacity, dtype=torch.bool, device=device)
            self.key_valid[:, :p] = valid.repeat_interleave(repeat, 0)
        # rotary tables for every decode step at once: step t of a row sits at its last prompt position + 1 + t
        ahead = positions[:, -1:] + 1 + torch.arange(max_new_tokens, device=device)
        self.step_cos, self.step_sin = (t.repeat_interleave(repeat, 0) for t in self._rope(ahead, dtype))
        self.prompt_length = self.length = p
        self.static, self.graph = static, None
        if static:
            self.slot = torch.zeros((), dtype=torch.long, device=device)  # the buffer position the next step writes
            self.static_token = torch.zeros(rows, dtype=torch.long, device=device)
        return self._logits(x[:, -1]).repeat_interleave(repeat, 0)

    def step(self, token: Tensor) -> Tensor:
        if not torch.is_grad_enabled() and self._fused_key is not None and self._fuse_weights(self.rows, self._fused_key[1]):
            self.graph = None  # the weights changed mid-rollout (an async worker loaded newer ones): a captured graph reads the old copies
        if self.static:
            return self._static_step(token)
        t = self.length - self.prompt_length
        cos, sin = self.step_cos[:, t : t + 1], self.step_sin[:, t : t + 1]
        if self.whole:  # every column, the ones not written yet masked out (see `_buffers`)
            written = self.slots <= self.length
            mask = (self.key_valid & written if self.padded else written[None])[:, None, None, :]
            x = self._layers(self._embed(token[:, None]), cos, sin, mask, self.length, attend=self.slots.shape[0])
        else:
            mask = self.key_valid[:, None, None, : self.length + 1] if self.padded else None
            x = self._layers(self._embed(token[:, None]), cos, sin, mask, self.length)
        self.length += 1
        return self._logits(x[:, -1])

    def resume(self, keys: list[Tensor], values: list[Tensor], mask: Tensor, max_new_tokens: int) -> None:
        """Continue from given keys/values (per layer [N, Hkv, S, D]; none for an empty prefix) of tokens under `mask`
        [N, S] (0 on padding): the next `step` feeds the token after them, at position `mask.sum(-1)`."""
        n, s = mask.shape
        capacity = s + max_new_tokens
        if not torch.is_grad_enabled():
            self._fuse_weights(n)
        dtype, device = self.dtype, mask.device
        self._buffers(n, capacity, dtype, device, False)
        for buffer, given in zip((*self.keys, *self.values), (*keys, *values)):
            buffer[:, :, :s] = given
        self.padded = not bool(mask.bool().all())
        if self.padded:
            self.key_valid = torch.ones(n, capacity, dtype=torch.bool, device=device)
            self.key_valid[:, :s] = mask.bool()
        ahead = mask.long().sum(-1, keepdim=True) + torch.arange(max_new_tokens, device=device)
        self.step_cos, self.step_sin = self._rope(ahead, dtype)
        self.prompt_length = self.length = s
        self.static, self.graph = False, None

    def row_cache(self, row: int, start: int, end: int) -> tuple[list[Tensor], list[Tensor]]:
        """Keys and values (per layer [Hkv, end - start, D]) of row `row` at buffer columns [start, end)."""
        return [k[row, :, start:end] for k in self.keys], [v[row, :, start:end] for v in self.values]

    def select(self, index: Tensor) -> None:
        """Keep rows `index` [N'] of the state, in that order (a beam's surviving hypotheses); not in static mode,
        whose buffers a captured graph holds."""
        if self.static:
            raise RuntimeError("a static (CUDA-graph) decoder cannot reorder its rows")
        self.keys, self.values = [k[index] for k in self.keys], [v[index] for v in self.values]
        self.step_cos, self.step_sin = self.step_cos[index], self.step_sin[index]
        if self.padded:
            self.key_valid = self.key_valid[index]

    # -- the fixed-shape step (CUDA graphs) ----------------------------------------------------------------

    def _static_forward(self) -> Tensor:
        """Logits of `self.static_token` at buffer slot `self.slot`: every shape fixed, every index a device tensor."""
        slot = self.slot.view(1)
        written = self.slots <= self.slot  # [capacity]: the prompt, the tokens so far and this one
        allowed = self.key_valid & written if self.padded else written[None]
        mask = allowed[:, None, None, :]
        step = slot - self.prompt_length
        cos, sin = self.step_cos.index_select(1, step), self.step_sin.index_select(1, step)
        x = self._embed(self.static_token[:, None])
        n = x.shape[0]
        for i, layer in enumerate(self.body.layers):
            attn = layer.self_attn
            q, k, v = self._attention_inputs(i, layer, x, cos, sin)
            self.keys[i].index_copy_(2, slot, k.transpose(1, 2))
            self.values[i].index_copy_(2, slot, v.transpose(1, 2))
            out = attention(q.transpose(1, 2), self.keys[i], self.values[i], mask, attn.scaling)
            x = x + self._linear(i, "o", attn.o_proj, out.transpose(1, 2).reshape(n, 1, -1))
            x = x + self._mlp(i, layer, x)
        return self._logits(x[:, -1])

    def _static_step(self, token: Tensor) -> Tensor:
        self.static_token.copy_(token)
        self.slot.fill_(self.length)
        self.length += 1
        if self.static_token.device.type != "cuda":
            return self._static_forward()
        if self.graph is None:
            self.graph, self.static_logits = self._capture()
        self.graph.replay()
        return self.static_logits.clone()  # the next replay overwrites the graph's output buffer

    def _capture(self) -> tuple[torch.cuda.CUDAGraph, Tensor]:
        """Record `_static_forward` as a CUDA graph. The warm-up runs (cuBLAS handles, SDPA's kernel choice) are
        the current step itself, repeated: they write the same keys/values at the same slot, so they change nothing."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._static_forward()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            logits = self._static_forward()
        return graph, logits

    # -- training forward (with gradient) ---------------------------------------------------------------

    def _tied(self) -> _TiedGradient | None:
        """A carrier for the head's weight gradient when the training forward can route the tied weight's whole
        gradient through the lookup (see `_TiedLookup`): the head a bias-free `nn.Linear` (called, so its hooks run)
        tied to a plain unhooked embedding (which `_TiedLookup` stands in for), gradients on, no autocast (whose casts
        the custom backward does not repeat). Else None."""
        embed, head = self.body.embed_tokens, self.lm.lm_head
        tied = type(embed) is nn.Embedding and type(head) is nn.Linear and _unhooked(embed) and embed.weight is head.weight and head.bias is None
        plain_lookup = tied and embed.max_norm is None and not embed.scale_grad_by_freq and not embed.sparse
        if not (plain_lookup and torch.is_grad_enabled() and head.weight.requires_grad):
            return None
        return None if torch.is_autocast_enabled(head.weight.device.type) else _TiedGradient()

    def completion_logits(self, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor, counts: Tensor) -> Tensor:
        """Logits [N, T, V] predicting each of the T completion tokens, for U distinct left-padded prompts
        [U, P] where prompt u is shared by `counts[u]` consecutive completion rows (N = counts.sum()).

        Equals `model(prompt + completion).logits[:, P-1 : P+T-1]` on every produced token: each distinct
        prompt is run once and its keys/values are shared by its completions. Positions after a
        completion's EOS may differ from `model.forward` (keys there are not masked); they never reach a
        loss, and they stay finite. Token-wise layers run on prompt and completion tokens in one batch."""
        (u, p), (n, width) = prompt_ids.shape, completion_ids.shape
        valid = prompt_mask.bool()
        positions = positions_from_mask(prompt_mask)
        real = positions[:, -1:] + 1  # the last prompt column is always a real token (left padding)
        completion_positions = (real + torch.arange(width, device=real.device)).repeat_interleave(counts, 0)
        causal = torch.ones(width, width, dtype=torch.bool, device=valid.device).tril()
        prompt_keys_ok = valid.repeat_interleave(counts, 0)[:, None, :].expand(n, width, p)
        completion_allowed = torch.cat([prompt_keys_ok, causal.expand(n, -1, -1)], dim=-1)[:, None]
        prompt_allowed = _prompt_mask(valid)[:, None] if not bool(valid.all()) else None
        tied = self._tied()
        ids = torch.cat([prompt_ids.reshape(-1), completion_ids.reshape(-1)])
        embed = self.body.embed_tokens
        x = embed(ids) if tied is None else _TiedLookup.apply(ids, embed.weight, embed.padding_idx, tied)  # [U*P + N*T, H]
        cos, sin = self._rope(torch.cat([positions.reshape(-1), completion_positions.reshape(-1)]), x.dtype)
        split = u * p
        for i, layer in enumerate(self.body.layers):
            attn = layer.self_attn
            q, k, v = self._attention_inputs(i, layer, x, cos, sin)  # [tokens, heads, D]
            qp, kp, vp = (t[:split].unflatten(0, (u, p)).transpose(1, 2) for t in (q, k, v))
            qc, kc, vc = (t[split:].unflatten(0, (n, width)).transpose(1, 2) for t in (q, k, v))
            out_p = attention(qp, kp, vp, prompt_allowed, attn.scaling, causal=True)
            keys = torch.cat([kp.repeat_interleave(counts, 0), kc], dim=2)
            values = torch.cat([vp.repeat_interleave(counts, 0), vc], dim=2)
            out_c = attention(qc, keys, values, completion_allowed, attn.scaling)
            out = torch.cat([out_p.transpose(1, 2).reshape(split, -1), out_c.transpose(1, 2).reshape(n * width, -1)])
            x = x + attn.o_proj(out)
            x = x + self._mlp(i, layer, x)
        last_prompt = x[:split].unflatten(0, (u, p))[:, -1:].repeat_interleave(counts, 0)
        hidden = torch.cat([last_prompt, x[split:].unflatten(0, (n, width))[:, :-1]], dim=1)
        hidden = self._norm(self.body.norm, hidden)
        head = self.lm.lm_head
        if tied is None:
            return head(hidden)
        # the head module is called (its hooks run) on the tied weight as `_TiedWeight` passes it on
        return torch.func.functional_call(head, {"weight": _TiedWeight.apply(head.weight, hidden, tied)}, (hidden,), strict=False)


class _TiedGradient:
    """The head's weight gradient of one training forward, handed from `_TiedWeight`'s backward to `_TiedLookup`'s."""

    head: Tensor | None = None


class _TiedWeight(torch.autograd.Function):
    """The tied weight W as the head reads it in a training forward: the identity, whose backward hands d loss / dW
    from the head (a fresh dense [V, H] matrix) to the lookup's backward instead of to autograd. `hidden`, the head's
    input, is an input here only to order the two backwards: it gets no gradient from this function, but autograd
    runs nothing upstream of it (the layers, then the lookup) before this backward has run."""

    @staticmethod
    def forward(ctx, weight: Tensor, hidden: Tensor, tied: _TiedGradient) -> Tensor:
        ctx.tied = tied
        return weight.view_as(weight)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[None, None, None]:
        ctx.tied.head = grad
        return None, None, None


class _TiedLookup(torch.autograd.Function):
    """The embedding lookup of a training forward whose head is tied to the same weight (`_TiedWeight`): its backward
    adds the looked-up rows' gradients into the head's dense gradient in place and returns the sum as the weight's one
    gradient. With the lookup and the head each handing autograd a gradient, autograd summed a dense [V, H] and a
    sparse one into a new dense matrix per backward (at a 49,152 x 576 bf16 head, 60-odd ms of a 900 ms micro-batch
    on 2 threads: the copy, the add and the sparse bookkeeping)."""

    @staticmethod
    def forward(ctx, ids: Tensor, weight: Tensor, padding_idx: int | None, tied: _TiedGradient) -> Tensor:
        ctx.save_for_backward(ids)
        ctx.shape, ctx.padding_idx, ctx.tied = weight.shape, padding_idx, tied
        return F.embedding(ids, weight, padding_idx)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[None, Tensor, None, None]:
        (ids,) = ctx.saved_tensors
        total, ctx.tied.head = ctx.tied.head, None
        if total is None:  # the loss did not reach the head
            total = grad.new_zeros(ctx.shape)
        rows = grad.reshape(-1, grad.shape[-1])
        if ctx.padding_idx is not None:  # as nn.Embedding: the padding row gets no gradient from the lookup
            rows = rows.masked_fill((ids.reshape(-1) == ctx.padding_idx)[:, None], 0)
        return None, total.index_add_(0, ids.reshape(-1), rows.to(total.dtype)), None, None


def _prompt_mask(valid: Tensor) -> Tensor:
    """[B, P, P] causal attention over real prompt tokens; a left-pad query sees only itself, which keeps its
    softmax finite (its output is never used)."""
    p = valid.shape[1]
    causal = torch.ones(p, p, dtype=torch.bool, device=valid.device).tril()
    return (causal & valid[:, None, :]) | torch.eye(p, dtype=torch.bool, device=valid.device)


def shared_prompts(prompt_ids: Tensor, prompt_mask: Tensor) -> tuple[Tensor, Tensor] | None:
    """(index of the first row of each run of identical consecutive prompts, run lengths), or None when no
    two consecutive rows share a prompt."""
    if prompt_ids.shape[0] < 2:
        return None
    same = (prompt_ids[1:] == prompt_ids[:-1]).all(-1) & (prompt_mask[1:] == prompt_mask[:-1]).all(-1)
    if not bool(same.any()):
        return None
    starts = torch.cat([torch.ones(1, dtype=torch.bool, device=same.device), ~same]).nonzero().squeeze(-1)
    counts = torch.diff(starts, append=torch.tensor([prompt_ids.shape[0]], device=starts.device))
    return starts, counts


def decoder_for(model: PreTrainedModel) -> FastLlamaDecoder | HFDecoder:
    return FastLlamaDecoder(model) if FastLlamaDecoder.supports(model) else HFDecoder(model)
