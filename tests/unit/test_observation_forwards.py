"""Multi-turn episodes through every forward pass: observations are attended, never trained on.

On `text_world` episodes (the environment's observations sit between the policy's actions), the log-probs
that each forward gives at the policy's tokens must equal what the sampler recorded while it sampled them:
the trainer's policy forward (fast shared-prompt path and the `model.forward` fallback), a frozen teacher's
forward, and a teacher read after a longer context (checked against an unpadded one-row forward). A forward
that used the loss mask as its attention mask (the old bug) reads the episode with its observations deleted;
the test shows that gives different numbers, so it can fail. The policy loss is blind to observation tokens.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from posttrain import resolve
from posttrain.models.decoders import FastLlamaDecoder, shared_prompts
from posttrain.models.logprobs import completion_forward
from posttrain.models.teacher import teacher_forward
from posttrain.objectives import losses

PARAMS = Path(__file__).resolve().parents[2] / "params.yaml"


@pytest.fixture(scope="module")
def episodes():
    from posttrain.models import build_tiny, train_char_tokenizer
    from posttrain.tasks import build_task
    from posttrain.trainers.online_rl import OnlineRL, RLRun
    from posttrain.trainers.sft import train_sft

    cfg = resolve.load(PARAMS, [
        "task.name=text_world", "task.n_train=60", "task.n_heldout=20", "model.hidden_size=32", "model.intermediate_size=64",
        "model.layers=2", "rl.max_new_tokens=10", "rl.group_size=3", "rl.temperature=1.5",
    ])
    task = build_task(cfg.task)
    tokenizer = train_char_tokenizer([task.alphabet()])
    torch.manual_seed(0)
    model = build_tiny(cfg.model, tokenizer)
    # a little SFT on the reference walks, so the policy moves through rooms (and the world answers) instead of
    # ending every episode with its first token
    train_sft(model, tokenizer, task.splits(0)["train"], cfg.sft.model_copy(update={"steps": 40, "warmup_steps": 0}), 0, on_log=lambda *a: None)
    trainer = OnlineRL(RLRun(model, tokenizer, task, task.splits(0)["train"], cfg.rl, 0, Path("unused"), "x"))
    batch, _, _ = trainer.rollout(task.splits(0)["train"][:4])
    observations = (batch.completion_mask == 0) & (batch.attention_mask == 1)
    assert observations.sum() >= 8, "the episodes must hold observation tokens for this test to mean anything"
    return trainer, batch


def on_policy_tokens(batch):
    return batch.completion_mask.bool()


def test_the_policy_forward_reproduces_the_sampler_on_both_paths(episodes):
    trainer, batch = episodes
    model, m = trainer.run.policy, on_policy_tokens(batch)
    assert FastLlamaDecoder.supports(model) and shared_prompts(batch.prompt_ids, batch.prompt_mask) is not None
    fast = completion_forward(model, batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.attention_mask, trainer.cfg.temperature)
    fallback = completion_forward(  # hidden states force the `model.forward` path
        model, batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.attention_mask, trainer.cfg.temperature, hidden=True
    )
    for out in (fast, fallback, trainer.policy_forward(batch)):
        assert torch.allclose(out.logp[m], batch.old_logp[m], atol=1e-4), (out.logp[m] - batch.old_logp[m]).abs().max()
    # the loss mask as attention mask deletes the observations: the numbers move, so this test can fail
    wrong = completion_forward(
        model, batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask, trainer.cfg.temperature, hidden=True
    )
    assert (wrong.logp[m] - batch.old_logp[m]).abs().max() > 1e-2


def test_a_teacher_reads_the_episode_as_the_policy_saw_it(episodes):
    trainer, batch = episodes
    m = on_policy_tokens(batch)
    out = teacher_forward(trainer.run.policy, batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.attention_mask, trainer.cfg.temperature)
    assert not out.logp.requires_grad
    assert torch.allclose(out.logp[m], batch.old_logp[m], atol=1e-4)


def test_a_teacher_context_equals_an_unpadded_forward_over_context_and_episode(episodes):
    from posttrain.trainers import contexts
    from posttrain.trainers.extras import row_examples, score_under

    trainer, batch = episodes
    model, tok, temperature = trainer.run.policy, trainer.run.tokenizer, trainer.cfg.temperature
    prompts = [e for e in trainer.run.examples[:4]]
    texts = [contexts.skill_context(e, "g" + "3" * (i % 3)) for i, e in enumerate(row_examples(prompts, batch))]  # contexts of unequal length
    scored = score_under(model, trainer.context("none"), texts, batch).logp
    for i, text in enumerate(texts):
        n = int(batch.attention_mask[i].sum())
        context = tok(text, add_special_tokens=False).input_ids
        ids = torch.tensor([context + batch.completion_ids[i, :n].tolist()])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(context) - 1 : len(context) - 1 + n]
        expected = torch.log_softmax(logits.float() / temperature, -1).gather(-1, ids[0, len(context):, None]).squeeze(-1)
        mask = batch.completion_mask[i, :n].bool()
        assert torch.allclose(scored[i, :n][mask], expected[mask], atol=1e-4)


def test_the_loss_ignores_observation_tokens(episodes):
    trainer, batch = episodes
    logp = trainer.policy_forward(batch).logp
    observations = ((batch.completion_mask == 0) & (batch.attention_mask == 1)).float()
    adv = torch.randn(batch.completion_ids.shape, generator=torch.Generator().manual_seed(1))
    loss, _ = losses.get("clip")(logp, batch.old_logp, adv, batch.completion_mask, trainer.cfg)
    moved, _ = losses.get("clip")(logp + 5.0 * observations, batch.old_logp, adv + 9.0 * observations, batch.completion_mask, trainer.cfg)
    assert torch.equal(loss, moved)
    (grad,) = torch.autograd.grad(loss, logp)
    assert (grad[observations.bool()] == 0).all() and (grad[batch.completion_mask.bool()] != 0).any()
