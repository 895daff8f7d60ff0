"""Teacher contexts (trainers/contexts.py) in their two framings, and the self-teachers reading them: a chat model's
teacher gets the natural framing rendered by its chat template with the example's system prompt; a model without a
template keeps the character framing."""

from __future__ import annotations

from pathlib import Path

import torch

from posttrain import resolve
from posttrain.models import load_pretrained, prepare_model
from posttrain.models.teacher import teacher_forward
from posttrain.rollout import RolloutBatch
from posttrain.rollout.sampling import encode_prompts, sample
from posttrain.tasks import Example
from posttrain.trainers import contexts
from posttrain.trainers.extras import ExtraContext, contrast_logp_gap, privileged_logprobs

PARAMS = Path(__file__).resolve().parents[2] / "params.yaml"
CPU = torch.device("cpu")
SYSTEM = "You add numbers."
EXAMPLE = Example("12+34=", "46", "46", system=SYSTEM)


def test_natural_framing_puts_the_problem_first_then_the_hint_then_the_request():
    told = contexts.answer_context(EXAMPLE, natural=True)
    assert told == f"12+34=\n\nA reference solution: 46\n{contexts.OWN_ANSWER}"
    assert contexts.answer_context(EXAMPLE) == f"46{contexts.SEP}12+34="  # the character framing is unchanged
    assert contexts.peer_context(EXAMPLE, "40+6=46", natural=True).startswith("12+34=\n\n") and "40+6=46" in contexts.peer_context(EXAMPLE, "40+6=46", natural=True)
    assert contexts.skill_context(EXAMPLE, "", natural=True) == EXAMPLE.prompt  # an empty skill adds nothing in either framing


def test_natural_contrastive_contexts_differ_in_their_label_words_only():
    positive, negative = contexts.contrastive_contexts(EXAMPLE, ["45", "56"], natural=True)
    assert positive.startswith("12+34=\n\n") and positive.endswith(contexts.OWN_ANSWER)
    assert [line for line in positive.splitlines() if ": " in line] == ["Right: 46", "Wrong: 45", "Wrong: 56"]
    assert [line for line in negative.splitlines() if ": " in line] == ["Wrong: 46", "Right: 45", "Right: 56"]
    assert len(positive) == len(negative) and len(contexts.RIGHT) == len(contexts.WRONG)
    differing = {i for i, (a, b) in enumerate(zip(positive, negative)) if a != b}
    label_spans = {i for start in (positive.index("Right: 46"), positive.index("Wrong: 45"), positive.index("Wrong: 56"))
                   for i in range(start, start + len(contexts.RIGHT))}
    assert differing and differing <= label_spans


def chat_run(chat_checkpoints, group_size=2):
    """A tiny chat checkpoint, its rollouts on two examples with a system prompt, and what a provider reads."""
    model, tokenizer = load_pretrained(chat_checkpoints["qwen2"])
    cfg = resolve.load(PARAMS, ["rl.max_new_tokens=3"])
    model = prepare_model(model, tokenizer, cfg.model, CPU, train=False)
    examples = [EXAMPLE, Example("01+02=", "3", "3", system=SYSTEM)]
    ids, mask = encode_prompts(tokenizer, examples, CPU)
    out = sample(model, ids, mask, group_size=group_size, max_new_tokens=3, eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id,
                 generator=torch.Generator().manual_seed(0))
    n = out.completion_ids.shape[0]
    batch = RolloutBatch(ids.repeat_interleave(group_size, 0), mask.repeat_interleave(group_size, 0), out.completion_ids, out.completion_mask,
                         torch.arange(2).repeat_interleave(group_size), out.logp, torch.zeros(n, 1), ("correctness",), torch.ones(1))
    ctx = ExtraContext(model, tokenizer, None, cfg.rl, {}, 1, torch.Generator().manual_seed(0))
    return model, tokenizer, examples, batch, ctx


def rendered(tokenizer, text: str) -> list[int]:
    conversation = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]
    return list(tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"])


def score(model, tokenizer, texts: list[str], batch: RolloutBatch):
    rows = [rendered(tokenizer, t) for t in texts]
    enc = tokenizer.pad({"input_ids": rows}, padding=True, padding_side="left", return_tensors="pt")
    return teacher_forward(model, enc["input_ids"], enc["attention_mask"], batch.completion_ids, batch.attention_mask)


def test_a_chat_models_opsd_teacher_reads_the_natural_framing_with_the_system_prompt(chat_checkpoints):
    model, tokenizer, examples, batch, ctx = chat_run(chat_checkpoints)
    want = score(model, tokenizer, [contexts.answer_context(e, natural=True) for e in examples for _ in range(2)], batch).logprobs
    assert torch.allclose(privileged_logprobs(ctx, examples, batch), want, atol=1e-5)
    character = score(model, tokenizer, [contexts.answer_context(e) for e in examples for _ in range(2)], batch).logprobs
    assert not torch.allclose(want, character, atol=1e-3)  # the framing reaches the teacher


def test_a_chat_models_sipo_teacher_reads_both_natural_framings(chat_checkpoints):
    model, tokenizer, examples, batch, ctx = chat_run(chat_checkpoints)  # every rollout failed: each row sees its group's other mistake
    texts = tokenizer.batch_decode(batch.completion_ids.masked_fill(batch.attention_mask == 0, tokenizer.pad_token_id), skip_special_tokens=True)
    pairs = []
    for row in range(batch.size):
        other = row ^ 1  # the other rollout of the row's group
        mistakes = [texts[other]] if texts[other] else []
        pairs.append(contexts.contrastive_contexts(examples[row // 2], mistakes, natural=True))
    want = score(model, tokenizer, [p for p, _ in pairs], batch).logp - score(model, tokenizer, [n for _, n in pairs], batch).logp
    assert torch.allclose(contrast_logp_gap(ctx, examples, batch), want, atol=1e-5)


def test_a_model_without_a_chat_template_keeps_the_character_framing(char_tokenizer):
    from posttrain.models import build_tiny

    cfg = resolve.load(PARAMS, ["model.hidden_size=32", "model.intermediate_size=64", "model.layers=2"])
    torch.manual_seed(0)
    model = build_tiny(cfg.model, char_tokenizer)
    examples = [Example("12+34=", "46", "46")]
    ids, mask = encode_prompts(char_tokenizer, examples, CPU)
    out = sample(model, ids, mask, group_size=2, max_new_tokens=3, eos_id=char_tokenizer.eos_token_id, pad_id=char_tokenizer.pad_token_id,
                 generator=torch.Generator().manual_seed(0))
    batch = RolloutBatch(ids.repeat_interleave(2, 0), mask.repeat_interleave(2, 0), out.completion_ids, out.completion_mask,
                         torch.zeros(2, dtype=torch.long), out.logp, torch.zeros(2, 1), ("correctness",), torch.ones(1))
    ctx = ExtraContext(model, char_tokenizer, None, cfg.rl, {}, 1, torch.Generator().manual_seed(0))
    told = encode_prompts(char_tokenizer, [f"46{contexts.SEP}12+34="] * 2, CPU)
    want = teacher_forward(model, *told, batch.completion_ids, batch.attention_mask).logprobs
    assert torch.allclose(privileged_logprobs(ctx, examples, batch), want, atol=1e-6)
