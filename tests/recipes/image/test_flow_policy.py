"""Flow-GRPO through the core RL step (recipes/image/policy.py over rollout/policy.py's `Policy`): the denoising chain's
recorded transitions are the completion tokens; re-scoring them under the sampling weights gives back the sampling
log-probs exactly (ratio 1 on the first pass); the judges are the reward matrix's columns; one step moves the weights
with a finite loss; the KL is the closed-form Gaussian one; the advantages are clipped by the step; micro-batches give
the whole batch's gradient."""

from __future__ import annotations

import copy

import torch

from helpers import micro_edits, repo_params
from posttrain.objectives.flow_grpo import gaussian_kl, sde_step
from posttrain.recipes.image.flow import build_flow_model
from posttrain.recipes.image.grpo import flow_trainer, rl_settings
from posttrain.recipes.image.policy import CONDITIONS, STATES, FlowPolicy, sigma_schedule
from posttrain.recipes.image.rewards import image_rewards
from posttrain.recipes.image.settings import FlowModelConfig, FlowRLConfig
from posttrain.recipes.image.vigor.edits import Edits
from posttrain.rollout.policy import Policy

PARAMS = repo_params()
MODEL = FlowModelConfig.model_validate({**PARAMS["flow"], "block_channels": [8, 16], "text_dim": 16})
SIZE = 8


def settings(**over) -> FlowRLConfig:
    return FlowRLConfig.model_validate({**PARAMS["flow_rl"], "steps": 2, "prompts_per_step": 2, "group_size": 2, "sampling_steps": 4,
                                        "checkpoint_every": 0, "lr": 1e-3, **over})


def edits() -> Edits:
    return micro_edits(3, SIZE, ("remove the tree on the left side", "add a building", "keep the scene"))


def trainer_of(cfg: FlowRLConfig):
    torch.manual_seed(0)
    model = build_flow_model(MODEL, SIZE).eval()
    return model, flow_trainer(model, edits(), cfg, seed=0)


def test_the_settings_and_the_policy_fit_the_core_step():
    cfg = settings(timestep_fraction=0.5, epochs_per_batch=3, beta=0.1, micro_batch=2, dynamic_sampling=True, dynamic_sampling_max_rollouts=2)
    rl = rl_settings(cfg)
    assert (rl.micro_batch, rl.dynamic_sampling, rl.dynamic_sampling_max_rollouts) == (2, True, 2)
    assert [r.name for r in rl.rewards] == ["ia", "bp", "qp"] and rl.max_new_tokens == 2  # J = int(0.5 * 4) transitions
    assert (rl.adv_clip_max, rl.epochs_per_batch, rl.beta, rl.lr_schedule, rl.warmup_steps) == (5.0, 3, 0.1, "constant", 0)
    assert isinstance(FlowPolicy(build_flow_model(MODEL, SIZE), cfg), Policy)


def test_forward_on_the_recorded_batch_reproduces_the_sampling_log_probs():
    cfg = settings(timestep_fraction=0.75)
    model, trainer = trainer_of(cfg)
    examples = trainer.run.examples
    batch, images, _ = trainer.rollout(examples[:2])
    assert batch.old_logp.shape == (4, 3) and bool((batch.completion_mask == 1).all())  # J = 3 transitions, all trained
    assert batch.extras[STATES].shape == (4, 4, 3, SIZE, SIZE)
    for i in range(batch.size):  # each sample carries its own edit's conditions
        assert torch.equal(batch.extras[CONDITIONS][i], examples[int(batch.group[i])].metadata[CONDITIONS])
    outputs = trainer.policy.forward(batch, 1.0)
    assert torch.equal(outputs.logp.detach(), batch.old_logp)  # bit for bit: the ratio is exactly 1 on the first pass
    assert bool((torch.exp(outputs.logp - batch.old_logp) == 1).all()) and outputs.logp.requires_grad
    judged = trainer.run.task.judged([examples[int(g)] for g in batch.group])
    for k, name in enumerate(batch.reward_names):  # the reward columns are the judges on the decoded images
        assert torch.equal(batch.rewards[:, k], image_rewards.get(name)(torch.stack(images), judged))


def test_one_step_changes_the_weights_with_a_finite_loss_and_the_closed_form_kl():
    cfg = settings(beta=0.5, epochs_per_batch=2)
    model, trainer = trainer_of(cfg)
    before = copy.deepcopy(model.state_dict())
    result = trainer.step(trainer.run.examples[:2])
    metrics = result.metrics
    assert all(torch.isfinite(torch.tensor(metrics[k])) for k in ("loss", "kl", "grad_norm"))
    assert metrics["mismatch/max_ratio"] == 1.0 and metrics["kl"] > 0  # the second pass has moved off the reference
    assert any(not torch.equal(before[n], p) for n, p in model.state_dict().items())

    # the KL term is the closed form between each recorded step's Gaussians under the policy and the reference
    policy, reference = trainer.policy, trainer.policy.over(trainer.models["reference"])
    batch = result.batch
    with torch.no_grad():
        kl = policy.kl(policy.forward(batch, 1.0), reference.forward(batch, 1.0))
    sigmas, text = sigma_schedule(4), model.encode_text([result.prompts[int(g)].prompt for g in batch.group])
    for j in range(kl.shape[1]):
        x, prev, cond = batch.extras[STATES][:, j], batch.extras[STATES][:, j + 1], batch.extras[CONDITIONS]
        with torch.no_grad():
            mine, ref = (sde_step(x, m(x, torch.tensor(sigmas[j]), cond, text), sigmas[j], sigmas[j + 1], cfg.noise_level, sigmas[1],
                                prev=prev)
                         for m in (model, trainer.models["reference"]))
        torch.testing.assert_close(kl[:, j], gaussian_kl(mine.mean, ref.mean, mine.scale))
    assert bool((kl > 0).all())


def test_the_step_clips_the_advantages():
    _, trainer = trainer_of(settings(adv_clip_max=0.05))
    metrics = trainer.step(trainer.run.examples[:2]).metrics
    assert 0 < metrics["advantage_abs_mean"] <= 0.05


def test_micro_batches_give_the_whole_batch_gradient():
    grads = []
    for micro_batch in (0, 1):
        model, trainer = trainer_of(settings(beta=0.5))
        trainer.cfg = trainer.cfg.model_copy(update={"micro_batch": micro_batch})
        batch, _, _ = trainer.rollout(trainer.run.examples[:2])
        with torch.no_grad():  # a reference that differs from the policy, so the KL has a gradient
            for p in trainer.models["reference"].parameters():
                p.add_(0.01)
        reference = trainer.reference_outputs(batch)
        trainer.optimizer.zero_grad()
        outputs, backward = trainer.update_forward(batch)
        backward(outputs.logp.sum() + trainer.policy.kl(outputs, reference).sum())
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    assert grads[0].abs().sum() > 0
    torch.testing.assert_close(grads[0], grads[1], atol=1e-5, rtol=1e-4)


def test_dynamic_sampling_refills_a_dropped_edit_with_a_fresh_one(monkeypatch):
    """An edit whose chains all score alike is dropped and one more edit is rolled out in its place: the refill's
    recorded states and conditions join the batch, and the step trains on `prompts_per_step` informative edits."""
    import posttrain.trainers.online_rl as online_rl

    real, calls = online_rl.informative_groups, []

    def first_edit_uninformative(batch):  # the first rollout's first edit: as if its images scored alike
        keep = real(batch)
        if not calls:
            keep = keep.clone()
            keep[0] = False
        calls.append(batch.size)
        return keep

    monkeypatch.setattr(online_rl, "informative_groups", first_edit_uninformative)
    _, trainer = trainer_of(settings(dynamic_sampling=True))
    examples = trainer.run.examples
    result = trainer.step(examples[:2], more_prompts=lambda n: examples[2 : 2 + n])
    assert calls == [4, 2]  # two edits x G = 2, then the one refill edit
    assert result.metrics["dynamic_sampling/dropped_groups"] == 1.0 and result.metrics["dynamic_sampling/extra_rollouts"] == 1.0
    assert [p.metadata["edit"] for p in result.prompts] == [1, 2] and result.batch.group.tolist() == [0, 0, 1, 1]
    for i in range(result.batch.size):  # each kept or refilled chain carries its own edit's conditions and states
        assert torch.equal(result.batch.extras[CONDITIONS][i], result.prompts[int(result.batch.group[i])].metadata[CONDITIONS])
    assert result.batch.extras[STATES].shape[0] == 4 and torch.isfinite(torch.tensor(result.metrics["loss"]))


def test_a_chain_without_noise_has_no_kl():
    _, trainer = trainer_of(settings(beta=0.5, noise_level=0.0))
    batch, _, _ = trainer.rollout(trainer.run.examples[:1])
    outputs = trainer.policy.forward(batch, 1.0)
    assert torch.equal(trainer.policy.kl(outputs, trainer.reference_outputs(batch)), torch.zeros(2, 2))
