"""`rl.micro_batch`: an update run in micro-batches has the whole batch's gradient (trainers/online_rl.py).

The same rollout (same seed) is trained once in one pass and once in micro-batches of 2 samples (groups of 3, so a
micro-batch cuts a group and the shared-prompt forward sees partial groups); the gradients of every trained
parameter, the loss and the metrics must agree, for losses that read batch statistics too."""

from __future__ import annotations

import pytest
import torch

from helpers import REPO, micro_rl_parts
from posttrain import resolve
from posttrain.rollout import RolloutBatch
from posttrain.trainers.online_rl import OnlineRL, PromptStream, RLRun

RL = ["rl.max_new_tokens=4", "rl.prompts_per_step=3", "rl.group_size=3", "rl.overlong_buffer=3",
      "rl.rewards=[{name: correctness}, {name: overlong}]"]


@pytest.fixture(scope="module")
def micro(tmp_path_factory):
    return micro_rl_parts(tmp_path_factory.mktemp("micro_batch"), RL, 30)


def one_update(micro, **rl_updates) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """The gradients the first update's optimiser step sees (by parameter name) and the step's metrics."""
    cfg, task, examples, tokenizer, state, model = micro
    model.load_state_dict(state)
    run = RLRun(model, tokenizer, task, examples, resolve.updated(cfg.rl, "rl", **rl_updates), seed=0, checkpoint_dir=REPO / "unused",
                config_hash="x")
    trainer = OnlineRL(run, total_steps=1)
    seen: dict[str, torch.Tensor] = {}
    step = trainer.loop.optimizer_step

    def recording(index, loss, params, optimizer, max_norm):
        trained = [*model.named_parameters(prefix="policy"), *(trainer.critic.named_parameters(prefix="critic") if trainer.critic else [])]
        seen.update({name: p.grad.detach().clone() for name, p in trained if p.grad is not None})
        return step(index, loss, params, optimizer, max_norm)

    trainer.loop.optimizer_step = recording
    metrics = trainer.step(PromptStream(examples, 0).take(3)).metrics
    return seen, metrics


@pytest.mark.parametrize("updates", [
    {}, {"loss": "clip_cov"}, {"loss": "gspo", "loss_agg": "seq_mean"}, {"beta": 0.1}, {"advantage": "gae"},
], ids=["clip", "clip_cov", "gspo", "kl", "gae_critic"])
def test_micro_batches_give_the_whole_batchs_gradient(micro, updates):
    whole, whole_metrics = one_update(micro, **updates)
    split, split_metrics = one_update(micro, micro_batch=2, **updates)
    assert whole and set(whole) == set(split)
    assert any(float(g.abs().max()) > 0 for g in whole.values())  # a real signal, not zeros on both sides
    for name, grad in whole.items():
        assert torch.allclose(split[name], grad, atol=1e-6, rtol=1e-4), (name, float((split[name] - grad).abs().max()))
    for key in ("loss", "grad_norm", "entropy"):
        assert split_metrics[key] == pytest.approx(whole_metrics[key], rel=1e-5, abs=1e-7), key


def test_rows_cut_every_per_sample_tensor_and_extra():
    batch = RolloutBatch(
        prompt_ids=torch.arange(12).view(6, 2), prompt_mask=torch.ones(6, 2), completion_ids=torch.arange(18).view(6, 3),
        completion_mask=torch.ones(6, 3), group=torch.tensor([0, 0, 0, 1, 1, 1]), old_logp=torch.zeros(6, 3),
        rewards=torch.arange(12.0).view(6, 2), reward_names=("a", "b"), reward_weights=torch.tensor([1.0, 0.5]),
        extras={"ref_logp": torch.ones(6, 3), "packed": torch.zeros(6, 3, 5)},
    )
    part = batch.rows(2, 5)
    assert part.size == 3 and part.group.tolist() == [0, 1, 1] and part.prompt_ids.tolist() == [[4, 5], [6, 7], [8, 9]]
    assert part.rewards.tolist() == [[4.0, 5.0], [6.0, 7.0], [8.0, 9.0]] and part.reward_weights.tolist() == [1.0, 0.5]
    assert part.extras["ref_logp"].shape == (3, 3) and part.extras["packed"].shape == (3, 3, 5)
    assert part.attention_mask.shape == (3, 3) and part.reward_names == ("a", "b")


@pytest.mark.parametrize("updates", [
    {}, {"beta": 0.1}, {"loss": "gspo", "loss_agg": "seq_mean"}, {"loss": "cispo", "loss_agg": "token_sum_norm"},
    {"correction": "tis", "epochs_per_batch": 2},
], ids=["clip", "kl", "gspo", "cispo", "tis_two_epochs"])
def test_a_loss_that_splits_over_rows_trains_with_one_forward_and_the_same_gradient(micro, monkeypatch, updates):
    """`update_by_rows` (one forward with gradient per micro-batch) against `update_forward` (a gradient-free forward
    of the whole batch first): the same gradients bit for bit (the same per-token arithmetic on the same values), the
    same figures, and half the forwards."""
    forwards = []
    real = OnlineRL.policy_forward
    monkeypatch.setattr(OnlineRL, "policy_forward", lambda self, batch: forwards.append(batch.size) or real(self, batch))
    rowwise, rowwise_metrics = one_update(micro, micro_batch=2, **updates)
    rowwise_forwards, forwards[:] = list(forwards), []
    monkeypatch.setattr(OnlineRL, "rows_apart", lambda self, batch, terms, warmup: False)
    twopass, twopass_metrics = one_update(micro, micro_batch=2, **updates)
    epochs = updates.get("epochs_per_batch", 1)
    sizes = [2, 2, 2, 2, 1]  # 9 samples (3 x 3) in micro-batches of 2
    assert rowwise_forwards == sizes * epochs and forwards == sizes * 2 * epochs
    assert set(rowwise) == set(twopass) and any(float(g.abs().max()) > 0 for g in twopass.values())
    for name, grad in twopass.items():
        assert torch.equal(rowwise[name], grad), (name, float((rowwise[name] - grad).abs().max()))
    assert set(rowwise_metrics) == set(twopass_metrics)
    for key, value in twopass_metrics.items():
        if key == "tokens_per_s":  # a clock
            continue
        assert rowwise_metrics[key] == pytest.approx(value, rel=1e-6, abs=1e-8, nan_ok=True), key


@pytest.mark.parametrize("updates, apart", [
    ({}, True), ({"loss": "clip_cov"}, False), ({"advantage": "gae", "aux": ["value"]}, False), ({"correction": "icepop"}, False),
    ({"micro_batch": 0}, False), ({"micro_batch": 9}, False),
], ids=["clip", "clip_cov", "value_term", "icepop", "no_micro_batch", "micro_batch_of_the_whole"])
def test_only_parts_declared_row_wise_take_the_one_forward_update(micro, updates, apart):
    cfg, task, examples, tokenizer, state, model = micro
    rl = resolve.updated(cfg.rl, "rl", **{"micro_batch": 2, **updates})
    trainer = OnlineRL(RLRun(model, tokenizer, task, examples, rl, seed=0, checkpoint_dir=REPO / "unused", config_hash="x"), total_steps=1)
    batch = trainer.collect(PromptStream(examples, 0).take(3), None)[0]
    assert trainer.rows_apart(batch, list(rl.aux), trainer.critic_warmup()) is apart
