"""The rollout engine (rollout/decode.py) against independent references.

Greedy decoding equals transformers' own `generate` token for token on left-padded prompts (both decoders: the fast
Llama-family one and the generic `model.forward` one); a multi-turn rollout through the KV cache equals one that
re-encodes the whole transcript every turn; every recorded log-prob equals a fresh forward's log-softmax over the
transcript (soft-token models included); prefilling from embeddings equals prefilling from ids; `select` equals
decoding the reordered batch.
"""

from __future__ import annotations

import pytest
import torch

from posttrain.envs.base import Env, Step
from posttrain.envs.rollout import multi_turn_sample
from posttrain.models.decoders import FastLlamaDecoder, HFDecoder, positions_from_mask
from posttrain.models.soft_tokens import SoftTokenLM
from posttrain.rollout import beam
from posttrain.rollout import decode as engine
from posttrain.rollout.decode import sample, sample_soft_tokens

PROMPTS = ["37+48=", "5+9=", "123*4=", "7="]  # unequal lengths: rows are left-padded


@pytest.fixture
def model(sharp_model):
    return sharp_model


@pytest.fixture(params=["fast", "hf"])
def decoder(request, monkeypatch):
    if request.param == "hf":
        monkeypatch.setattr(engine, "decoder_for", HFDecoder)
        monkeypatch.setattr(beam, "decoder_for", HFDecoder)
    return request.param


def encode(tokenizer, prompts):
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    assert not bool(enc.attention_mask.all())
    return enc.input_ids, enc.attention_mask


def test_greedy_equals_transformers_generate(model, decoder, char_tokenizer):
    ids, mask = encode(char_tokenizer, PROMPTS)
    eos, pad = char_tokenizer.eos_token_id, char_tokenizer.pad_token_id
    ours = sample(model, ids, mask, group_size=1, max_new_tokens=10, eos_id=eos, pad_id=pad, greedy=True)
    theirs = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=10, eos_token_id=eos, pad_token_id=pad)
    theirs = theirs[:, ids.shape[1]:]
    assert theirs.shape[1] > 3 and len({tuple(r) for r in theirs.tolist()}) > 1  # rows differ: the check is not vacuous
    assert torch.equal(ours.completion_ids, theirs)


class Echo(Env):
    """Repeats each action `width` times as the observation (widths differ per env, so rows feed observations of
    different lengths side by side) and ends after `turns` actions."""

    def __init__(self, prompt: str, width: int, turns: int):
        self.prompt, self.width, self.turns = prompt, width, turns

    def reset(self) -> str:
        self.taken = 0
        return self.prompt

    def step(self, action: str) -> Step:
        self.taken += 1
        return Step(action * self.width, 0.0, self.taken >= self.turns)


def echoes() -> list[Echo]:
    envs = [Echo(p, width, turns) for p, width, turns in zip(PROMPTS, (1, 3, 0, 2), (4, 3, 5, 2))]
    assert [env.reset() for env in envs] == PROMPTS
    return envs


@torch.no_grad()
def reencoded_rollout(model, tokenizer, envs, max_tokens):
    """Greedy multi-turn without a cache: every turn runs `model.forward` over prompt + transcript of each episode."""
    transcripts, acted, done, finished = [[] for _ in envs], [[] for _ in envs], [False] * len(envs), [False] * len(envs)
    prompts = [tokenizer(env.reset(), add_special_tokens=False).input_ids for env in envs]
    while not all(done):
        for i, env in enumerate(envs):
            if done[i]:
                continue
            row = torch.tensor([prompts[i] + transcripts[i]])
            token = int(model(input_ids=row).logits[0, -1].argmax())
            transcripts[i].append(token)
            acted[i].append(1)
            if token == tokenizer.eos_token_id:
                done[i] = finished[i] = True
                continue
            step = env.step(tokenizer.decode([token]))
            observation = tokenizer(step.observation, add_special_tokens=False).input_ids
            transcripts[i] += observation
            acted[i] += [0] * len(observation)
            done[i] = finished[i] = step.done
            done[i] = done[i] or len(transcripts[i]) >= max_tokens
    return transcripts, acted, finished


@torch.no_grad()
def transcript_logp(model, tokenizer, prompts, samples):
    """log-softmax of a fresh forward over prompt + transcript, at every transcript token."""
    ids, mask = encode(tokenizer, prompts)
    full_ids = torch.cat([ids, samples.completion_ids], dim=1)
    full_mask = torch.cat([mask, samples.attention], dim=1)
    logits = model(input_ids=full_ids, attention_mask=full_mask, position_ids=positions_from_mask(full_mask)).logits
    logits = logits[:, ids.shape[1] - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, samples.completion_ids[..., None]).squeeze(-1)


@pytest.mark.parametrize("max_tokens", [6, 30])
def test_multi_turn_with_the_cache_equals_reencoding_every_turn(model, decoder, char_tokenizer, max_tokens):
    samples = multi_turn_sample(model, char_tokenizer, echoes(), PROMPTS, max_tokens, greedy=True)
    transcripts, acted, finished = reencoded_rollout(model, char_tokenizer, echoes(), max_tokens)
    assert sum(a.count(0) for a in acted) > 4  # observations were fed
    for row, (want, want_acted) in enumerate(zip(transcripts, acted)):
        n = int(samples.attention[row].sum())
        assert samples.completion_ids[row, :n].tolist() == want
        assert samples.completion_mask[row, :n].tolist() == want_acted
        assert (samples.completion_ids[row, n:] == char_tokenizer.pad_token_id).all()
    assert samples.finished.tolist() == finished
    # log-probs are recorded on policy tokens only, and equal a fresh forward's over the whole transcript
    policy = samples.completion_mask.bool()
    assert (samples.logp[~policy] == 0).all()
    torch.testing.assert_close(samples.logp[policy], transcript_logp(model, char_tokenizer, PROMPTS, samples)[policy], atol=1e-5, rtol=0)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_multi_turn_logprobs_equal_a_fresh_forward(model, decoder, char_tokenizer, temperature):
    samples = multi_turn_sample(model, char_tokenizer, echoes(), PROMPTS, 20, temperature, torch.Generator().manual_seed(0))
    policy = samples.completion_mask.bool()
    assert ((samples.attention == 1) & ~policy).any()
    want = transcript_logp(model, char_tokenizer, PROMPTS, samples) if temperature == 1.0 else None
    if want is None:  # the sampling distribution is the tempered one
        ids, mask = encode(char_tokenizer, PROMPTS)
        full_mask = torch.cat([mask, samples.attention], dim=1)
        with torch.no_grad():
            logits = model(input_ids=torch.cat([ids, samples.completion_ids], 1), attention_mask=full_mask,
                           position_ids=positions_from_mask(full_mask)).logits[:, ids.shape[1] - 1 : -1].float()
        want = torch.log_softmax(logits / temperature, -1).gather(-1, samples.completion_ids[..., None]).squeeze(-1)
    torch.testing.assert_close(samples.logp[policy], want[policy], atol=1e-5, rtol=0)


def test_prefill_from_embeddings_equals_prefill_from_ids(model, decoder, char_tokenizer):
    ids, mask = encode(char_tokenizer, PROMPTS)
    args = dict(group_size=2, max_new_tokens=6, eos_id=char_tokenizer.eos_token_id, pad_id=char_tokenizer.pad_token_id)
    from_ids = sample(model, ids, mask, generator=torch.Generator().manual_seed(1), **args)
    with torch.no_grad():
        embeds = model.get_input_embeddings()(ids)
    from_embeds = sample(model, None, mask, embeds=embeds, generator=torch.Generator().manual_seed(1), **args)
    assert torch.equal(from_ids.completion_ids, from_embeds.completion_ids)
    torch.testing.assert_close(from_ids.logp, from_embeds.logp, atol=1e-6, rtol=0)


@pytest.mark.parametrize("decoder_cls", [FastLlamaDecoder, HFDecoder])
@torch.no_grad()
def test_select_equals_decoding_the_reordered_rows(model, char_tokenizer, decoder_cls):
    ids, mask = encode(char_tokenizer, PROMPTS)
    tokens = torch.randint(3, model.config.vocab_size, (len(PROMPTS) * 2, 3), generator=torch.Generator().manual_seed(2))
    index = torch.tensor([7, 0, 0, 3, 5, 5, 2, 1])
    state = decoder_cls(model)
    state.prefill(ids, mask, 2, 4)
    state.step(tokens[:, 0])
    state.select(index)
    got = state.step(tokens[index, 1])
    fresh = decoder_cls(model)
    fresh.prefill(ids.repeat_interleave(2, 0)[index], mask.repeat_interleave(2, 0)[index], 1, 4)
    fresh.step(tokens[index, 0])
    torch.testing.assert_close(got, fresh.step(tokens[index, 1]), atol=1e-5, rtol=0)


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_soft_token_samples_record_the_logprobs_of_a_fresh_forward(model, decoder, char_tokenizer, temperature):
    """Soft tokens [B, N, H] spliced before left-padded prompts prefill the cache as embeddings; the recorded log-probs
    are the soft-token model's own completion log-probs (its full forward over soft tokens, prompt and completion)."""
    ids, mask = encode(char_tokenizer, PROMPTS)
    lm = SoftTokenLM(torch.nn.Identity(), model, char_tokenizer)
    soft = torch.randn(len(PROMPTS), 3, model.config.hidden_size, generator=torch.Generator().manual_seed(3))
    samples = sample_soft_tokens(lm, soft, ids, mask, 8, temperature, torch.Generator().manual_seed(4))
    produced = samples.completion_mask.bool()
    with torch.no_grad():
        want = lm.completion_logp_from(soft, ids, mask, samples.completion_ids, samples.completion_mask)
    assert samples.completion_ids.shape[1] > 2
    torch.testing.assert_close(samples.logp[produced], want[produced], atol=1e-5, rtol=0)
    if temperature == 0.0:  # greedy: every recorded token is the most likely one
        with torch.no_grad():
            logits = lm.completion_logits(soft, ids, mask, samples.completion_ids, samples.completion_mask)
        assert torch.equal(logits.argmax(-1)[produced], samples.completion_ids[produced])


@torch.no_grad()
def test_beam_search_as_wide_as_the_vocabulary_finds_the_best_two_token_completion(model, decoder, char_tokenizer):
    """Beam search reuses the engine's cache (prefill, `select`, step); as wide as the vocabulary it is exhaustive
    over two tokens, so its best hypothesis is the enumerated maximum of log p(a) + log p(b | a) (or log p(EOS))."""
    ids, mask = encode(char_tokenizer, PROMPTS[:2])
    vocab, eos = model.config.vocab_size, char_tokenizer.eos_token_id
    tokens, _, _, scores, _ = beam.beam_search(model, char_tokenizer, PROMPTS[:2], 2, vocab, vocab, 0.0)
    for row in range(2):
        real = ids[row][mask[row] == 1]
        first = torch.log_softmax(model(input_ids=real[None]).logits[0, -1].float(), -1)
        pairs = torch.cat([real.repeat(vocab, 1), torch.arange(vocab)[:, None]], dim=1)
        second = torch.log_softmax(model(input_ids=pairs).logits[:, -1].float(), -1)
        total = first[:, None] + second
        total[eos] = float("-inf")
        best = divmod(int(total.argmax()), vocab)
        want = [eos] if first[eos] > total.max() else list(best)
        assert tokens[row].tolist() == want
        assert scores[row] == pytest.approx(float(max(first[eos], total.max())), abs=1e-4)


@pytest.mark.parametrize("decoder_cls", [FastLlamaDecoder, HFDecoder])
@torch.no_grad()
def test_resume_from_exported_rows_equals_the_uninterrupted_decode(model, char_tokenizer, decoder_cls):
    """What the MCMC samplers do: take each row's keys/values out (`row_cache`), and later continue from them
    (`resume`), here with an extra column of padding in front of every row."""
    ids, mask = encode(char_tokenizer, PROMPTS)
    tokens = torch.randint(3, model.config.vocab_size, (len(PROMPTS), 3), generator=torch.Generator().manual_seed(5))
    plain = decoder_cls(model)
    plain.prefill(ids, mask, 1, 3)
    plain.step(tokens[:, 0])
    want = [plain.step(tokens[:, 1]), plain.step(tokens[:, 2])]
    width = ids.shape[1] + 1  # the prompt and the first fed token
    rows = [plain.row_cache(r, 0, width) for r in range(len(PROMPTS))]
    layers = len(rows[0][0])

    def pad(t):  # [Hkv, S, D] -> [Hkv, 1 + S, D]
        return torch.cat([torch.zeros_like(t[:, :1]), t], dim=1)

    keys = [torch.stack([pad(rows[r][0][i]) for r in range(len(PROMPTS))]) for i in range(layers)]
    values = [torch.stack([pad(rows[r][1][i]) for r in range(len(PROMPTS))]) for i in range(layers)]
    resumed = decoder_cls(model)
    resumed.resume(keys, values, torch.cat([torch.zeros_like(mask[:, :1]), mask, torch.ones_like(mask[:, :1])], dim=1), 2)
    got = [resumed.step(tokens[:, 1]), resumed.step(tokens[:, 2])]
    torch.testing.assert_close(torch.stack(got), torch.stack(want), atol=1e-5, rtol=0)
