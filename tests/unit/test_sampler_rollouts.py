"""RL rollouts drawn by an inference-time sampler (`rl.sampler`): the batch's old log-probs are the policy's own on
the drawn tokens (not the sampler's record), an update moves the weights, and the names are checked at the boundary."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from posttrain import resolve
from posttrain.errors import UserError
from posttrain.models.logprobs import completion_forward

PARAMS = Path(__file__).resolve().parents[2] / "params.yaml"
MICRO = ["task.n_train=40", "task.n_heldout=10", "model.hidden_size=32", "model.intermediate_size=64", "model.layers=2",
         "rl.prompts_per_step=3", "rl.group_size=4", "rl.max_new_tokens=4", "rl.warmup_steps=0", "rl.lr=0.01"]


def trainer_for(overrides, sft_steps: int = 0):
    from posttrain.models import build_tiny, train_char_tokenizer
    from posttrain.tasks import build_task
    from posttrain.trainers.online_rl import OnlineRL, RLRun
    from posttrain.trainers.sft import train_sft

    cfg = resolve.load(PARAMS, MICRO + overrides)
    task = build_task(cfg.task)
    tok = train_char_tokenizer([task.alphabet()])
    torch.manual_seed(0)
    model = build_tiny(cfg.model, tok)
    if sft_steps:  # a few steps, so answers are sometimes well formed: the format reward then varies within a group
        train_sft(model, tok, task.splits(0)["train"], cfg.sft.model_copy(update={"steps": sft_steps, "batch_size": 16, "warmup_steps": 0}), 0,
                  on_log=lambda *a: None)
    return OnlineRL(RLRun(model, tok, task, task.splits(0)["train"], cfg.rl, 0, Path("unused"), "x")), task


def test_power_sampled_rollouts_train_on_the_policys_log_probs():
    # rl.temperature 1.5: the policy's distribution differs from the base p the power sampler records, so using the
    # sampler's numbers as old_logp would show (the check below can fail)
    trainer, task = trainer_for(["rl.sampler=power", "rl.temperature=1.5", "rl.options.power.mcmc_steps=1", "rl.options.power.blocks=2"],
                                sft_steps=30)
    policy, prompts = trainer.run.policy, task.splits(0)["train"][:3]
    batch, texts, metrics = trainer.rollout(prompts)
    m = batch.completion_mask.bool()
    assert batch.size == 12 and len(texts) == 12 and m.sum() > 12
    with torch.no_grad():
        own = completion_forward(policy, batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.attention_mask, 1.5).logp
    assert torch.allclose(batch.old_logp[m], own[m], atol=1e-5) and (batch.old_logp[~m] == 0).all()
    assert abs(metrics["rollout/sampler_logp_gap"]) > 1e-2  # the sampler's record is not the policy's
    assert metrics["rollout/mh_moves"] > 0 and 0 < metrics["rollout/mh_acceptance"] <= 1
    assert metrics["rollout/forward_tokens_per_sample"] > metrics["completion_length"]  # MH moves cost forward tokens
    before = [p.detach().clone() for p in policy.parameters()]
    result = trainer.step(prompts)
    assert result.metrics["advantage_abs_mean"] > 0  # a non-degenerate signal reached the loss
    assert result.metrics["rollout/mh_moves"] > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.parameters()))  # the weights moved


def test_the_default_rollouts_are_the_policys_temperature_samples():
    trainer, task = trainer_for([])
    assert trainer.cfg.sampler == "temperature"
    batch, _, metrics = trainer.rollout(task.splits(0)["train"][:2])
    assert not any(k.startswith("rollout/") for k in metrics)  # the sampler path is not taken


@pytest.mark.parametrize("overrides, message", [
    (["rl.sampler=beam"], "rl.sampler: 'beam' draws one answer per prompt"),
    (["rl.sampler=nucleus"], "rl.sampler: unknown sampler 'nucleus'"),
    (["rl.options.power.alpha=0.5"], "rl.options.power.alpha"),
])
def test_rl_sampler_names_and_options_are_checked_at_the_boundary(overrides, message):
    with pytest.raises(UserError, match=message):
        resolve.load(PARAMS, overrides)
