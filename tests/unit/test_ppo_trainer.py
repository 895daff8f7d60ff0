"""PPO through `OnlineRL` on a micro model: the critic is built, warmed up while the policy stays put, trained in its
own parameter group, carries no gradient into the policy loss, and is checkpointed and restored with the trainer."""

from __future__ import annotations

import copy

import pytest
import torch

from helpers import REPO, micro_rl_parts
from posttrain import resolve
from posttrain.config import CriticConfig
from posttrain.errors import UserError
from posttrain.models.value import load_critic, save_critic, token_values
from posttrain.objectives import advantages, losses
from posttrain.trainers.extras import provide
from posttrain.trainers.online_rl import OnlineRL, PromptStream, RLRun

# a random micro model solves nothing: the length reward makes rewards differ, so GAE and the critic get a signal
PPO = ["rl.preset=ppo", "rl.max_new_tokens=4", "rl.prompts_per_step=3", "rl.group_size=3", "rl.overlong_buffer=3",
       "rl.rewards=[{name: correctness}, {name: overlong}]"]


@pytest.fixture(scope="module")
def micro(tmp_path_factory):
    return micro_rl_parts(tmp_path_factory.mktemp("ppo"), PPO, 50)


def trainer_for(micro, **rl_updates) -> tuple[OnlineRL, PromptStream]:
    cfg, task, examples, tokenizer, state, model = micro
    model.load_state_dict(state)
    rl = resolve.updated(cfg.rl, "rl", **rl_updates)
    run = RLRun(model, tokenizer, task, examples, rl, seed=0, checkpoint_dir=REPO / "unused", config_hash="x")
    return OnlineRL(run, total_steps=4), PromptStream(examples, 0)


def weights(module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def moved(before: dict, module) -> float:
    return max(float((module.state_dict()[k] - v).abs().max()) for k, v in before.items())


def test_the_ppo_preset_names_gae_clip_and_the_value_loss(micro):
    rl = micro[0].rl
    assert (rl.advantage, rl.loss, rl.aux, rl.loss_agg) == ("gae", "clip", ("value",), "token_mean")


def test_critic_warms_up_before_the_policy_moves_then_both_learn(micro):
    trainer, stream = trainer_for(micro, critic=CriticConfig(path=None, lr=5e-3, warmup_steps=2))
    policy, critic = trainer.run.policy, trainer.critic
    assert critic is not None and all(p.requires_grad for p in critic.parameters())
    start_policy, start_critic = weights(policy), weights(critic)
    history = [trainer.step(stream.take(3)).metrics for _ in range(2)]
    assert [h["critic_warmup"] for h in history] == [1.0, 1.0]
    assert moved(start_policy, policy) == 0.0 and moved(start_critic, critic) > 0  # only the critic learned
    after_warmup = weights(policy)
    history += [trainer.step(stream.take(3)).metrics for _ in range(2)]
    assert history[-1]["critic_warmup"] == 0.0 and moved(after_warmup, policy) > 0
    # a non-degenerate signal: rewards differ, the advantages are not 0, the critic fits something
    assert all(h["reward/overlong_std"] > 0 and h["advantage_abs_mean"] > 0 and h["value/loss"] > 0 for h in history)
    assert history[-1]["value/mean"] != 0.0  # the zero head has moved
    for key in ("value/explained_variance", "value/clipfrac", "value/grad_norm"):
        assert key in history[-1]


def test_critic_tensors_carry_no_gradient_into_the_policy_loss(micro):
    trainer, stream = trainer_for(micro)
    policy, critic, cfg = trainer.run.policy, trainer.critic, trainer.cfg
    batch, _, prompts, _ = trainer.collect(stream.take(3), None)
    batch = provide(trainer.needs, trainer.context, prompts, batch)
    adv = advantages.get("gae")(batch, cfg)
    assert not batch.extras["values"].requires_grad and not adv.requires_grad and adv.abs().sum() > 0
    outputs = trainer.policy_forward(batch)
    loss, _ = losses.get("clip")(outputs.logp, batch.old_logp, adv, batch.completion_mask, cfg)
    loss.backward()
    assert all(p.grad is None for p in critic.parameters())  # the policy loss reaches no critic weight
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.parameters())
    trainer.optimizer.zero_grad(set_to_none=True)
    from posttrain.objectives import auxiliaries

    value, _ = auxiliaries.get("value")(batch, outputs, cfg)
    value.backward()
    assert all(p.grad is None for p in policy.parameters())  # and the value loss no policy weight
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in critic.parameters())
    trainer.optimizer.zero_grad(set_to_none=True)


def test_the_critic_is_checkpointed_and_restored_with_the_trainer(micro):
    straight, stream = trainer_for(micro)
    for _ in range(3):
        straight.step(stream.take(3))
    expected_policy, expected_critic = weights(straight.run.policy), weights(straight.critic)

    first, stream = trainer_for(micro)
    first.step(stream.take(3))
    saved = copy.deepcopy({"trainer": first.state_dict(), "stream": stream.state_dict(), "policy": weights(first.run.policy)})
    assert "critic" in saved["trainer"]
    resumed, stream = trainer_for(micro)  # a fresh critic from the starting policy, then the checkpoint
    resumed.run.policy.load_state_dict(saved["policy"])
    resumed.load_state_dict(saved["trainer"])
    stream.load_state_dict(saved["stream"])
    for _ in range(2):
        resumed.step(stream.take(3))
    assert moved(expected_policy, resumed.run.policy) == 0.0 and moved(expected_critic, resumed.critic) == 0.0


def test_a_saved_critic_loads_by_path_and_a_frozen_critic_is_not_trained(micro, tmp_path):
    trainer, stream = trainer_for(micro, critic=CriticConfig(path=None, lr=5e-3, warmup_steps=0))
    trainer.step(stream.take(3))
    save_critic(trainer.critic, tmp_path / "critic")
    cfg, _, _, tokenizer, _, model = micro
    loaded = load_critic(tmp_path / "critic", "cpu")
    ids = torch.tensor([[3, 4, 5]])
    one = torch.ones_like(ids)
    with torch.no_grad():
        assert torch.allclose(token_values(loaded, ids, one, ids, one), token_values(trainer.critic, ids, one, ids, one), atol=1e-6)
    # gae without the value term: the critic (by path) is the frozen baseline, outside the optimiser
    frozen, stream = trainer_for(micro, aux=[], critic=CriticConfig(path=str(tmp_path / "critic"), lr=5e-3, warmup_steps=0))
    assert frozen.critic is None and not any(p.requires_grad for p in frozen.models["critic"].parameters())
    before = weights(frozen.models["critic"])
    metrics = frozen.step(stream.take(3)).metrics
    assert moved(before, frozen.models["critic"]) == 0.0 and "value/loss" not in metrics
    with pytest.raises(UserError, match="rl.critic.path"):
        trainer_for(micro, critic=CriticConfig(path=str(tmp_path / "nowhere"), lr=5e-3, warmup_steps=0))


def test_a_ppo_run_resumed_from_a_checkpoint_ends_as_the_uninterrupted_run(micro, tmp_path):
    """Through the real checkpoint files (trainers/checkpoint.py) and `train_online_rl`: run 3 updates with a
    checkpoint after each; resume a fresh process-like start (starting weights) from the step-1 checkpoint alone.
    The kill itself (SIGKILL between checkpoints) is the generic rl kill test's (tests/integration/test_resume.py)."""
    import shutil

    from safetensors.torch import load_file

    from posttrain.trainers.rl import train_online_rl

    cfg, task, examples, tokenizer, state, model = micro
    rl = resolve.updated(cfg.rl, "rl", steps=3, checkpoint_every=1, critic=CriticConfig(path=None, lr=5e-3, warmup_steps=1))

    def run(directory, resume: bool):
        model.load_state_dict(state)
        run = RLRun(model, tokenizer, task, examples, rl, seed=0, checkpoint_dir=directory / "checkpoints", config_hash="x",
                    critic_out=directory / "critic")
        history, _ = train_online_rl(run, resume, on_log=lambda step, m: None)
        return history, weights(model)

    straight_history, straight_policy = run(tmp_path / "a", resume=False)
    shutil.copytree(tmp_path / "a" / "checkpoints" / "step-000001", tmp_path / "b" / "checkpoints" / "step-000001")
    resumed_history, resumed_policy = run(tmp_path / "b", resume=True)
    assert all(torch.equal(straight_policy[k], resumed_policy[k]) for k in straight_policy)
    a, b = load_file(tmp_path / "a" / "critic" / "model.safetensors"), load_file(tmp_path / "b" / "critic" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    drop = {"tokens_per_s"}
    assert [{k: v for k, v in h.items() if k not in drop} for h in straight_history] == \
           [{k: v for k, v in h.items() if k not in drop} for h in resumed_history]
    assert [h["critic_warmup"] for h in straight_history] == [1.0, 0.0, 0.0]
