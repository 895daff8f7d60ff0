"""The incremental decoders and the grouped training forward agree with `model.forward`.

FastLlamaDecoder (fused q/k/v and gate/up, static KV buffer), HFDecoder (DynamicCache) and
`completion_logprobs` (prompt encoded once per group) must give the logits and log-probs a plain
`model.forward` over `prompt + completion` gives, on tiny random Qwen2 and Llama models built offline,
with and without left padding, with and without LoRA-wrapped projections.
"""

from __future__ import annotations

import copy

import pytest
import torch

from posttrain.config import LoraConfig
from posttrain.models import maybe_lora
from posttrain.models import logprobs as logprob_module
from posttrain.models.logprobs import completion_logprobs, token_logprobs
from posttrain.rollout import decode as engine
from posttrain.models.decoders import FastLlamaDecoder, HFDecoder, attention, decoder_for, positions_from_mask, shared_prompts, use_sampler_dtype
from posttrain.rollout.decode import CDF_BLOCK, invert_cdf
from posttrain.rollout.sampling import categorical, sample

GROUP, NEW = 3, 5
PROMPTS = ["37+48=", "5+9=", "123*4=", "7="]  # unequal lengths: rows are left-padded


@pytest.fixture
def model(sharp_model):
    return sharp_model


def encode(tokenizer, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    return enc.input_ids, enc.attention_mask


@pytest.fixture(params=["unpadded", "left-padded"])
def prompts(request, char_tokenizer):
    texts = [PROMPTS[0], PROMPTS[0][::-1]] if request.param == "unpadded" else PROMPTS
    ids, mask = encode(char_tokenizer, texts)
    assert bool(mask.all()) == (request.param == "unpadded")
    return ids, mask


@torch.no_grad()
def reference_logits(model, prompt_ids, prompt_mask, completion_ids) -> torch.Tensor:
    """`model.forward` over prompt + completion: logits [N, T, V] predicting each completion token."""
    ids = torch.cat([prompt_ids, completion_ids], dim=1)
    mask = torch.cat([prompt_mask, torch.ones_like(completion_ids)], dim=1)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions_from_mask(mask)).logits
    return logits[:, prompt_ids.shape[1] - 1 : -1]


def reference_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask, temperature=1.0) -> torch.Tensor:
    ids = torch.cat([prompt_ids, completion_ids], dim=1)
    mask = torch.cat([prompt_mask, completion_mask], dim=1)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions_from_mask(mask)).logits[:, prompt_ids.shape[1] - 1 : -1]
    return torch.log_softmax(logits.float() / temperature, dim=-1).gather(-1, completion_ids[..., None]).squeeze(-1)


@torch.no_grad()
def decode_teacher_forced(decoder, prompt_ids, prompt_mask, completion_ids) -> torch.Tensor:
    """Logits [N, T, V] from prefill + one step per given completion token."""
    out = [decoder.prefill(prompt_ids, prompt_mask, GROUP, completion_ids.shape[1])]
    for t in range(completion_ids.shape[1] - 1):
        out.append(decoder.step(completion_ids[:, t]))
    return torch.stack(out, dim=1)


@pytest.mark.parametrize("decoder_cls", [FastLlamaDecoder, HFDecoder])
def test_decoder_logits_equal_forward(model, prompts, decoder_cls):
    ids, mask = prompts
    torch.manual_seed(1)
    completion = torch.randint(3, model.config.vocab_size, (ids.shape[0] * GROUP, NEW))
    got = decode_teacher_forced(decoder_cls(model), ids, mask, completion)
    want = reference_logits(model, ids.repeat_interleave(GROUP, 0), mask.repeat_interleave(GROUP, 0), completion)
    assert got.shape == want.shape
    assert want.std() > 0.5  # the check is not vacuous
    torch.testing.assert_close(got, want.float(), atol=1e-5, rtol=0)


def test_static_step_equals_the_plain_step(model, prompts, monkeypatch):
    """The fixed-shape step a CUDA graph replays (whole KV buffer, unwritten slots masked, slot index on the device)
    gives the plain step's logits; on the CPU it runs eagerly, so this checks its arithmetic without a GPU. Fresh
    buffers come filled with NaN here: a masked-out slot that was never written must not reach the output
    (attention weight 0 times a NaN value is NaN)."""
    empty, empty_like = torch.empty, torch.empty_like
    monkeypatch.setattr(torch, "empty", lambda *a, **k: empty(*a, **k).fill_(float("nan")) if k.get("dtype", torch.float32).is_floating_point
                        else empty(*a, **k))
    monkeypatch.setattr(torch, "empty_like", lambda t, *a, **k: empty_like(t, *a, **k).fill_(float("nan")) if t.is_floating_point()
                        else empty_like(t, *a, **k))
    ids, mask = prompts
    torch.manual_seed(2)
    completion = torch.randint(3, model.config.vocab_size, (ids.shape[0] * GROUP, NEW))
    plain = decode_teacher_forced(FastLlamaDecoder(model), ids, mask, completion)
    static_decoder = FastLlamaDecoder(model)
    out = [static_decoder.prefill(ids, mask, GROUP, NEW, static=True)]
    for t in range(NEW - 1):
        out.append(static_decoder.step(completion[:, t]))
    assert static_decoder.graph is None  # no CUDA here: the eager path ran
    torch.testing.assert_close(torch.stack(out, dim=1), plain, atol=1e-5, rtol=0)


def test_a_reused_decoder_prepares_its_weights_again_after_they_change(model, prompts):
    """The decode loop's weight copies (fused, blocked for oneDNN) are kept while the parameters are unchanged and made
    again after an in-place update (an optimizer step): a reused decoder never decodes with stale weights."""
    ids, mask = prompts
    model = copy.deepcopy(model)
    completion = torch.randint(3, model.config.vocab_size, (ids.shape[0] * GROUP, NEW))
    decoder = FastLlamaDecoder(model)
    before = decode_teacher_forced(decoder, ids, mask, completion)
    prepared = decoder.fused
    again = decode_teacher_forced(decoder, ids, mask, completion)
    assert decoder.fused is prepared and torch.equal(again, before)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.9)
    after = decode_teacher_forced(decoder, ids, mask, completion)
    assert decoder.fused is not prepared and not torch.allclose(after, before)
    assert torch.equal(after, decode_teacher_forced(FastLlamaDecoder(model), ids, mask, completion))
    torch.testing.assert_close(after, reference_logits(model, ids.repeat_interleave(GROUP, 0), mask.repeat_interleave(GROUP, 0), completion),
                               rtol=1e-4, atol=1e-4)


def test_weights_loaded_between_decode_steps_are_used_from_the_next_step(model, prompts):
    """An async rollout worker copies newer weights into the model between decode steps: the fast decoder's next step
    uses them, as `model.forward` does (HFDecoder, whose cache also holds the earlier tokens' keys under the old weights)."""
    ids, mask = prompts
    model = copy.deepcopy(model)
    newer = {k: v * 0.9 for k, v in model.state_dict().items()}
    completion = torch.randint(3, model.config.vocab_size, (ids.shape[0] * GROUP, NEW))
    fast, plain = FastLlamaDecoder(model), HFDecoder(model)
    with torch.no_grad():
        got, want = [fast.prefill(ids, mask, GROUP, NEW)], [plain.prefill(ids, mask, GROUP, NEW)]
        for t in range(NEW - 1):
            if t == 2:
                for key, tensor in model.state_dict().items():  # as the workers load: in place
                    tensor.copy_(newer[key])
            got.append(fast.step(completion[:, t]))
            want.append(plain.step(completion[:, t]))
    torch.testing.assert_close(torch.stack(got, 1), torch.stack(want, 1), rtol=1e-4, atol=1e-4)


def test_under_autocast_the_loop_keeps_its_weights_unblocked_and_prepares_them_once(model, prompts):
    """Autocast picks each matmul's dtype per call, which a blocked weight would bypass: under it the loop's copies stay
    plain tensors, and its steps (under autocast too) do not prepare them again."""
    ids, mask = prompts
    decoder = FastLlamaDecoder(model)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        decoder.prefill(ids, mask, GROUP, 3)
        prepared = decoder.fused
        logits = decoder.step(torch.full((ids.shape[0] * GROUP,), 5))
    assert decoder.fused is prepared and not decoder.head.is_mkldnn and not prepared[0]["qkv"].is_mkldnn
    assert torch.isfinite(logits).all()


def test_the_decode_loop_calls_hooked_modules(model, prompts):
    """A projection or head with a forward hook is called, not replaced by the loop's weight copy: the decoder's logits
    equal the hooked model's forward."""
    ids, mask = prompts
    model = copy.deepcopy(model)
    completion = torch.randint(3, model.config.vocab_size, (ids.shape[0] * GROUP, NEW))
    hooks = [model.lm_head.register_forward_hook(lambda m, args, out: out.index_fill(-1, torch.tensor([3]), -30.0)),
             model.model.layers[0].mlp.down_proj.register_forward_hook(lambda m, args, out: 2 * out)]
    try:
        got = decode_teacher_forced(FastLlamaDecoder(model), ids, mask, completion)
        want = reference_logits(model, ids.repeat_interleave(GROUP, 0), mask.repeat_interleave(GROUP, 0), completion)
    finally:
        for hook in hooks:
            hook.remove()
    assert torch.all(got[..., 3] == -30.0)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(got, decode_teacher_forced(FastLlamaDecoder(model), ids, mask, completion), atol=1e-3)


def test_sample_with_cuda_graph_requested_on_cpu_is_the_plain_sample(model, prompts, char_tokenizer):
    """`cuda_graph=True` is ignored off CUDA: the same draws, token for token."""
    ids, mask = prompts
    kwargs = dict(group_size=GROUP, max_new_tokens=NEW, eos_id=char_tokenizer.eos_token_id, pad_id=char_tokenizer.pad_token_id)
    plain = sample(model, ids, mask, generator=torch.Generator().manual_seed(0), **kwargs)
    graphed = sample(model, ids, mask, generator=torch.Generator().manual_seed(0), cuda_graph=True, **kwargs)
    assert torch.equal(plain.completion_ids, graphed.completion_ids) and torch.equal(plain.logp, graphed.logp)


@pytest.mark.parametrize("static", [False, True])
def test_sampler_dtype_decodes_as_the_cast_model_and_leaves_the_weights(model, prompts, static):
    """`model.sampler_dtype: bfloat16` on a float32 model: the decode loop's logits are exactly those of the same model
    cast to bfloat16 (every matmul, the KV buffer and the norms in bf16, logits returned in float32; the rotary table
    kept in float32), the float32 weights are untouched, the training forward stays float32, and the cast moves the
    logits by bf16 rounding only."""
    ids, mask = prompts
    torch.manual_seed(3)
    completion = torch.randint(3, model.config.vocab_size, (ids.shape[0] * GROUP, NEW))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    exact = decode_teacher_forced(FastLlamaDecoder(model), ids, mask, completion)
    cast_model = copy.deepcopy(model).to(torch.bfloat16)
    cast_model.model.rotary_emb.inv_freq = model.model.rotary_emb.inv_freq.clone()  # .to() cast the rotary table too; the loop keeps it
    want = decode_teacher_forced(FastLlamaDecoder(cast_model), ids, mask, completion)
    use_sampler_dtype(model, torch.bfloat16)
    try:
        decoder = FastLlamaDecoder(model)
        if static:
            with torch.no_grad():  # as the rollout runs: the cast copies are taken without gradient
                out = [decoder.prefill(ids, mask, GROUP, NEW, static=True)]
                out += [decoder.step(completion[:, t]) for t in range(NEW - 1)]
            got = torch.stack(out, dim=1)
        else:
            got = decode_teacher_forced(decoder, ids, mask, completion)
        assert decoder.dtype == torch.bfloat16 and decoder.keys[0].dtype == torch.bfloat16 and got.dtype == torch.float32
        assert torch.equal(got, want)  # the same bf16 program
        gap = float((got - exact).abs().max())
        assert 0 < gap < 0.1 * float(exact.abs().max()), gap  # it did decode in bf16, and moved the logits by its rounding only
        assert all(torch.equal(v, before[k]) and v.dtype == before[k].dtype for k, v in model.state_dict().items())
        with torch.enable_grad():
            logits = FastLlamaDecoder(model).completion_logits(ids, mask, completion, torch.full((ids.shape[0],), GROUP))
        assert logits.dtype == torch.float32
        torch.testing.assert_close(logits, reference_logits(model, ids.repeat_interleave(GROUP, 0), mask.repeat_interleave(GROUP, 0), completion),
                                   atol=1e-5, rtol=0)
    finally:
        use_sampler_dtype(model, None)


def test_sampler_dtype_is_ignored_with_lora_wrapped_projections(model):
    """LoRA-wrapped layers are called as modules in the weights' dtype: the loop samples in float32."""
    lora = LoraConfig(r=4, alpha=8, dropout=0.0, target_modules=("q_proj", "v_proj"))
    peft_model = maybe_lora(copy.deepcopy(model), lora)
    use_sampler_dtype(peft_model, torch.bfloat16)
    decoder = FastLlamaDecoder(peft_model)
    with torch.no_grad():
        decoder._fuse_weights()
    assert decoder.dtype == torch.float32 and not decoder.cast


def test_sampler_dtype_is_ignored_with_biased_gate_and_up():
    """gate/up with biases are not fused, so the loop keeps the weights' dtype instead of mixing bf16 and float32."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    biased = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                          num_key_value_heads=1, mlp_bias=True))
    use_sampler_dtype(biased, "bfloat16")
    ids, mask = torch.tensor([[3, 4, 5]]), torch.ones(1, 3, dtype=torch.long)
    decoder = FastLlamaDecoder(biased)
    with torch.no_grad():
        logits = decoder.prefill(ids, mask, 2, 2)
    assert decoder.dtype == torch.float32 and not decoder.cast and torch.isfinite(logits).all()


def test_fast_decoder_is_chosen_for_llama_family(model):
    assert isinstance(decoder_for(model), FastLlamaDecoder)


def test_fast_decoder_with_lora_wrapped_projections(model, char_tokenizer):
    """LoRA-wrapped q/k/v are called as modules (no fusion), and the adapters count."""
    lora = LoraConfig(r=4, alpha=8, dropout=0.0, target_modules=("q_proj", "k_proj", "v_proj", "o_proj"))
    peft_model = maybe_lora(copy.deepcopy(model), lora)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.3 * torch.randn_like(p))
    assert FastLlamaDecoder.supports(peft_model)
    ids, mask = encode(char_tokenizer, PROMPTS)
    completion = torch.randint(3, model.config.vocab_size, (ids.shape[0] * GROUP, NEW))
    rows_ids, rows_mask = ids.repeat_interleave(GROUP, 0), mask.repeat_interleave(GROUP, 0)
    got = decode_teacher_forced(FastLlamaDecoder(peft_model), ids, mask, completion)
    want = reference_logits(peft_model, rows_ids, rows_mask, completion)
    torch.testing.assert_close(got, want.float(), atol=1e-5, rtol=0)
    with peft_model.disable_adapter():
        plain = reference_logits(peft_model, rows_ids, rows_mask, completion)
    assert not torch.allclose(want, plain, atol=1e-3), "adapters had no effect: the test would not see them skipped"
    # the grouped training forward goes through the same wrapped modules
    logp, _ = completion_logprobs(peft_model, rows_ids, rows_mask, completion, torch.ones_like(completion))
    want_logp = reference_logprobs(peft_model, rows_ids, rows_mask, completion, torch.ones_like(completion))
    torch.testing.assert_close(logp, want_logp, atol=1e-5, rtol=0)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("which", ["fast", "hf"])
def test_sample_logprobs_equal_recomputed(model, prompts, char_tokenizer, monkeypatch, which, temperature):
    ids, mask = prompts
    if which == "hf":
        monkeypatch.setattr(engine, "decoder_for", HFDecoder)
    eos = char_tokenizer.eos_token_id
    out = sample(model, ids, mask, group_size=GROUP, max_new_tokens=NEW, eos_id=eos, pad_id=char_tokenizer.pad_token_id,
                 temperature=temperature, generator=torch.Generator().manual_seed(0))
    n = ids.shape[0] * GROUP
    assert out.completion_ids.shape[0] == n and out.completion_ids.shape[1] <= NEW
    produced = out.completion_mask.bool()
    assert (out.logp[~produced] == 0).all() and (out.completion_ids[~produced] == char_tokenizer.pad_token_id).all()
    rows_ids, rows_mask = ids.repeat_interleave(GROUP, 0), mask.repeat_interleave(GROUP, 0)
    with torch.no_grad():
        logp, entropy = completion_logprobs(
            model, rows_ids, rows_mask, out.completion_ids, out.completion_mask, temperature, with_entropy=True
        )
        want = reference_logprobs(model, rows_ids, rows_mask, out.completion_ids, out.completion_mask, temperature)
    torch.testing.assert_close(out.logp[produced], logp[produced], atol=1e-4, rtol=0)
    torch.testing.assert_close(logp[produced], want[produced], atol=1e-5, rtol=0)
    assert torch.isfinite(logp).all() and torch.isfinite(entropy).all()


def test_sample_stops_at_eos_and_is_seeded(model, char_tokenizer):
    ids, mask = encode(char_tokenizer, PROMPTS)
    args = dict(group_size=GROUP, max_new_tokens=8, eos_id=char_tokenizer.eos_token_id, pad_id=char_tokenizer.pad_token_id)
    a = sample(model, ids, mask, generator=torch.Generator().manual_seed(3), **args)
    b = sample(model, ids, mask, generator=torch.Generator().manual_seed(3), **args)
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.logp, b.logp)
    lengths = a.completion_mask.sum(-1)
    ends = a.completion_ids.gather(1, (lengths - 1)[:, None]).squeeze(1)
    assert torch.equal(a.finished, ends == char_tokenizer.eos_token_id)
    greedy = sample(model, ids, mask, greedy=True, **args)
    assert (greedy.completion_ids.view(len(PROMPTS), GROUP, -1) == greedy.completion_ids.view(len(PROMPTS), GROUP, -1)[:, :1]).all()


def _logp_and_grads(model, weights: torch.Tensor, forward) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """`forward()`'s log-probs and every parameter's gradient of (log-probs * weights).sum(), from zeroed gradients."""
    model.zero_grad(set_to_none=True)
    logp = forward()
    (logp * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return logp.detach(), grads


def _assert_same_grads(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=1e-4, rtol=1e-4, msg=lambda m: f"{name}: {m}")  # noqa: B023  (called at once)


def test_grouped_training_forward_matches_forward_with_gradients(model, prompts, char_tokenizer):
    """completion_logprobs encodes each shared prompt once; values and gradients equal the plain forward's."""
    ids, mask = prompts
    out = sample(model, ids, mask, group_size=GROUP, max_new_tokens=NEW, eos_id=char_tokenizer.eos_token_id,
                 pad_id=char_tokenizer.pad_token_id, generator=torch.Generator().manual_seed(5))
    rows_ids, rows_mask = ids.repeat_interleave(GROUP, 0), mask.repeat_interleave(GROUP, 0)
    weights = torch.randn(out.completion_ids.shape) * out.completion_mask
    assert shared_prompts(rows_ids, rows_mask) is not None
    got, got_grads = _logp_and_grads(model, weights, lambda: completion_logprobs(model, rows_ids, rows_mask, out.completion_ids, out.completion_mask)[0])
    want, want_grads = _logp_and_grads(model, weights, lambda: reference_logprobs(model, rows_ids, rows_mask, out.completion_ids, out.completion_mask))
    produced = out.completion_mask.bool()
    torch.testing.assert_close(got[produced], want[produced], atol=1e-5, rtol=0)
    _assert_same_grads(got_grads, want_grads)


def test_the_training_forward_runs_the_hooks_of_a_tied_head_and_lookup(model, prompts):
    """The shared-prompt training forward routes a tied weight's gradient around autograd (`_TiedWeight`/`_TiedLookup`)
    and still runs the hooks: the head module is called on the tied weight (the fast path kept), a hooked embedding
    is called itself (the plain path). Log-probs and gradients equal the hooked model's forward, as the decode loop's
    log-probs do (the speed benchmark's EOS-off hook on the head once ran in the sampler but not in the update: a
    mismatch of 2.5e-3 per token at its `small` shape; then, skipping the fast path for it, 4 s a step at `smollm2`)."""
    assert model.config.tie_word_embeddings and model.lm_head.weight is model.model.embed_tokens.weight
    ids, mask = prompts
    rows_ids, rows_mask = ids.repeat_interleave(GROUP, 0), mask.repeat_interleave(GROUP, 0)
    completion = torch.randint(4, model.config.vocab_size, (rows_ids.shape[0], NEW))
    completion_mask = torch.ones_like(completion)
    weights = torch.randn(completion.shape)
    for module, hook, fast in ((model.lm_head, lambda m, args, out: out.index_fill(-1, completion[0, :1], -30.0), True),
                               (model.model.embed_tokens, lambda m, args, out: 2 * out, False)):
        handle = module.register_forward_hook(hook)
        try:
            assert (FastLlamaDecoder(model)._tied() is not None) is fast
            got, got_grads = _logp_and_grads(model, weights, lambda: completion_logprobs(model, rows_ids, rows_mask, completion, completion_mask)[0])
            want, want_grads = _logp_and_grads(model, weights, lambda: reference_logprobs(model, rows_ids, rows_mask, completion, completion_mask))
        finally:
            handle.remove()
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
        _assert_same_grads(got_grads, want_grads)
        with torch.no_grad():
            plain = completion_logprobs(model, rows_ids, rows_mask, completion, completion_mask)[0]
        assert not torch.allclose(got, plain, atol=1e-3)  # the hook changed the log-probs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("length", [1, 6])  # a decode step; a training forward's block of queries
@pytest.mark.parametrize("masking", ["none", "causal", "mask", "padding"])
def test_attention_equals_sdpa_in_float64(dtype, length, masking):
    """`attention` (the grouped matmuls on the CPU for decode steps and bf16 training forwards, SDPA otherwise) gives
    SDPA's outputs and gradients, computed in float64 on the same inputs, to the dtype's rounding; GQA heads grouped
    as SDPA's enable_gqa groups them (query head h reads KV head h // (Hq / Hkv))."""
    torch.manual_seed(0)
    n, heads, groups, keys, dim = 3, 6, 2, 9, 8
    q = torch.randn(n, heads, length, dim, dtype=dtype, requires_grad=True)
    k, v = (torch.randn(n, groups, keys, dim, dtype=dtype, requires_grad=True) for _ in range(2))
    mask, causal = None, masking == "causal"
    if masking == "mask":  # padding: row r's first r keys hidden, and causal over the last `length` keys
        mask = (torch.arange(keys)[None, :] >= torch.arange(n)[:, None])[:, None, None, :].expand(n, 1, length, keys)
        mask = mask & torch.ones(length, keys, dtype=torch.bool).tril(keys - length)
    elif masking == "padding":  # one row of keys for every query: broadcast over the queries, as SDPA takes it
        mask = (torch.arange(keys)[None, :] >= torch.arange(n)[:, None])[:, None, None, :]
    out = attention(q, k, v, mask, 0.3, causal)
    out.backward(torch.ones_like(out))
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    want = torch.nn.functional.scaled_dot_product_attention(
        *leaves, attn_mask=mask, is_causal=causal and mask is None and length > 1, scale=0.3, enable_gqa=True)
    want.backward(torch.ones_like(want))
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 3e-2, "rtol": 3e-2}
    assert out.dtype == dtype and out.shape == want.shape
    torch.testing.assert_close(out.double(), want, **tol)
    for got, leaf in zip((q, k, v), leaves):
        torch.testing.assert_close(got.grad.double(), leaf.grad, **tol)


def test_bf16_training_forward_and_decoder_are_the_eager_bf16_model(model, prompts):
    """In bf16 on the CPU the grouped training forward and the decode loop run `attention`'s matmul path: their logits
    are exactly those of the bf16 model under transformers' eager attention, and differ from its SDPA forward by bf16
    rounding only (a few units in the last place at the logits' magnitude)."""
    ids, mask = prompts
    torch.manual_seed(4)
    completion = torch.randint(3, model.config.vocab_size, (ids.shape[0] * GROUP, NEW))
    half = copy.deepcopy(model).to(torch.bfloat16)
    half.model.rotary_emb.inv_freq = model.model.rotary_emb.inv_freq.clone()
    rows_ids, rows_mask = ids.repeat_interleave(GROUP, 0), mask.repeat_interleave(GROUP, 0)
    with torch.no_grad():
        trained = FastLlamaDecoder(half).completion_logits(ids, mask, completion, torch.full((ids.shape[0],), GROUP)).float()
    decoded = decode_teacher_forced(FastLlamaDecoder(half), ids, mask, completion)
    sdpa = reference_logits(half, rows_ids, rows_mask, completion).float()
    half.set_attn_implementation("eager")
    eager = reference_logits(half, rows_ids, rows_mask, completion).float()
    assert torch.equal(trained, eager) and torch.equal(decoded, eager)
    ulp = 2.0 ** (torch.floor(torch.log2(sdpa.abs().max())) - 7)
    assert 0 < float((eager - sdpa).abs().max()) <= 4 * ulp


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_logprobs_equal_the_unfused_ops(dtype, temperature, monkeypatch):
    """The chunked log-prob (forward, entropy and gradient) equals `log_softmax(logits.float() / T).gather(ids)` and
    autograd through it, over a row count that is no multiple of the chunk; the gradient comes back in the logits' dtype."""
    monkeypatch.setattr(logprob_module, "CHUNK_ROWS", 5)
    torch.manual_seed(1)
    logits = (torch.randn(3, 11, 97) * 3).to(dtype).requires_grad_()
    ids, weights = torch.randint(0, 97, (3, 11)), torch.randn(3, 11)
    logp, spread = token_logprobs(logits, ids, temperature, entropy=True)
    (logp * weights).sum().backward()
    got_grad, logits.grad = logits.grad, None
    full = torch.log_softmax(logits.float() / temperature, dim=-1)
    want = full.gather(-1, ids[..., None]).squeeze(-1)
    (want * weights).sum().backward()
    assert logp.dtype == torch.float32 and got_grad.dtype == dtype and not spread.requires_grad
    torch.testing.assert_close(logp, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(spread, -(full.exp() * full).sum(-1).detach(), atol=1e-4, rtol=0)
    torch.testing.assert_close(got_grad.float(), logits.grad.float(), atol=1e-6 if dtype == torch.float32 else 0, rtol=0 if dtype == torch.float32 else 1e-2)
    assert token_logprobs(logits, ids)[1] is None


def test_two_level_cdf_follows_the_distribution_and_never_draws_a_zero_weight():
    """Over a vocabulary of whole blocks the CDF is inverted block, then entry: the draws follow the weights (a zero
    block, zeros at block edges and a one-hot row included), the total is each row's sum, and no zero-weight entry is
    ever drawn, whatever the uniform."""
    torch.manual_seed(2)
    v = 4 * CDF_BLOCK
    weights = torch.rand(v) ** 4
    weights[CDF_BLOCK : 2 * CDF_BLOCK] = 0  # a whole block
    weights[CDF_BLOCK - 1 :: CDF_BLOCK] = 0  # the last entry of every block
    weights[0] = 0
    rows = 40_000
    draws, total = invert_cdf(weights.expand(rows, -1).contiguous(), torch.Generator().manual_seed(0))
    freq = torch.bincount(draws, minlength=v).float() / rows
    assert float(freq[weights == 0].sum()) == 0
    torch.testing.assert_close(freq, weights / weights.sum(), atol=3e-3, rtol=0)
    torch.testing.assert_close(total.squeeze(1), weights.sum().expand(rows), rtol=1e-5, atol=0)
    for index in (0, 5, CDF_BLOCK, v - 1):  # one-hot rows: at a block's start, inside one, at the very end
        one = torch.zeros(64, v)
        one[:, index] = 3.0
        assert invert_cdf(one, torch.Generator().manual_seed(index))[0].eq(index).all()


def test_shared_prompts_finds_runs():
    ids = torch.tensor([[1, 2], [1, 2], [3, 4], [1, 2], [1, 2], [1, 2]])
    mask = torch.ones_like(ids)
    starts, counts = shared_prompts(ids, mask)
    assert starts.tolist() == [0, 2, 3] and counts.tolist() == [2, 1, 3]
    assert shared_prompts(ids[1:4], mask[1:4]) is None
    padded = mask.clone()
    padded[1, 0] = 0  # same ids, different mask: not the same prompt
    assert shared_prompts(ids, padded)[1].tolist() == [1, 1, 1, 3]


def test_categorical_draws_follow_the_distribution():
    probs = torch.tensor([0.1, 0.0, 0.2, 0.3, 0.4])
    logp = probs.log().expand(200_000, -1)
    draws = categorical(logp, torch.Generator().manual_seed(0))
    freq = torch.bincount(draws, minlength=5).float() / draws.numel()
    assert freq[1] == 0
    torch.testing.assert_close(freq, probs, atol=5e-3, rtol=0)
