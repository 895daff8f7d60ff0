"""Witness advantage on hand-made tensors, the `distribution` task, and a 2-step run of both."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from posttrain import resolve
from posttrain.errors import UserError
from posttrain.objectives import advantages
from posttrain.objectives.grpo import group_normalize
from posttrain.objectives.witness import WitnessOptions, kernel_matrix, witness_advantage
from posttrain.rollout import RolloutBatch
from posttrain.tasks import Example, build_task
from posttrain.tasks.distribution import total_variation

Q = [0.5, 0.3, 0.2]


def opts(**kw) -> WitnessOptions:
    return WitnessOptions(**{"kernel": "delta", "bandwidth": 1.0, "leave_one_out": True, "as_reward": False, "scale": 1.0, **kw})


def adv(outcomes, q=Q, group=None, **kw) -> torch.Tensor:
    k = torch.tensor(outcomes)
    g = torch.zeros_like(k) if group is None else torch.tensor(group)
    return witness_advantage(k, torch.tensor([q] * len(outcomes)), g, opts(**kw))


def test_delta_kernel_matches_the_closed_form():
    out = [0, 0, 0, 1, 2]
    n = {0: 3, 1: 1, 2: 1}
    expected = [Q[k] - (n[k] - 1) / (len(out) - 1) for k in out]
    assert torch.allclose(adv(out), torch.tensor(expected))


def test_under_produced_outcome_gets_positive_advantage_over_produced_negative():  # invariant 1
    a = adv([0, 0, 0, 0, 1])  # p_hat = (.8, .2, 0) vs q = (.5, .3, .2)
    assert (a[:4] < 0).all() and a[4] > 0


def test_identical_group_gets_q_minus_one_not_zero():  # invariant 2
    a = adv([1] * 6)
    assert torch.allclose(a, torch.full((6,), Q[1] - 1.0)) and (a < 0).all()
    same_reward = torch.ones(6)  # group-scored GRPO: the same reward for all => zero signal
    assert torch.all(group_normalize(same_reward, torch.zeros(6, dtype=torch.long)) == 0)


@pytest.mark.parametrize("kernel", ["delta", "rbf"])
def test_advantage_depends_only_on_counts(kernel):  # invariant 3
    out, group = [0, 2, 0, 1, 2, 1, 1, 0], [0, 1, 0, 1, 0, 1, 1, 0]
    a = adv(out, group=group, kernel=kernel)
    perm = torch.randperm(len(out), generator=torch.Generator().manual_seed(0))
    b = adv([out[i] for i in perm], group=[group[i] for i in perm], kernel=kernel)
    assert torch.allclose(a[perm], b)
    for i in range(len(out)):
        for j in range(len(out)):
            if out[i] == out[j] and group[i] == group[j]:
                assert a[i] == a[j]


@pytest.mark.parametrize("kernel", ["delta", "rbf"])
def test_leave_one_out_is_unbiased_for_the_population_witness(kernel):  # invariant 4 (Monte-Carlo)
    p, q, group_size, n_groups = torch.tensor([0.6, 0.3, 0.1]), torch.tensor([0.2, 0.3, 0.5]), 4, 40_000
    gen = torch.Generator().manual_seed(0)
    outcomes = torch.multinomial(p, n_groups * group_size, replacement=True, generator=gen)
    group = torch.arange(n_groups).repeat_interleave(group_size)
    o = opts(kernel=kernel, bandwidth=0.8)
    a = witness_advantage(outcomes, q.expand(len(outcomes), 3), group, o)
    f = kernel_matrix(3, o)[:3, :3] @ (p - q)  # population witness
    assert abs(float(a.mean()) - float(-(p * f).sum())) < 0.01


def test_invalid_outcome_has_q_zero_and_its_own_kernel_row():
    a = adv([-1, -1, 0, 1])
    assert torch.allclose(a[:2], torch.full((2,), -1 / 3))  # q_invalid - (n_inv - 1)/(G - 1)
    assert torch.allclose(a[2:], torch.tensor([0.5, 0.3]))  # the invalid rows do not count for valid outcomes
    gram = kernel_matrix(3, opts(kernel="rbf"))
    assert torch.equal(gram[-1], torch.tensor([0.0, 0.0, 0.0, 1.0])) and torch.allclose(gram, gram.T)
    assert math.isclose(float(gram[0, 1]), math.exp(-0.5), rel_tol=1e-6)


def test_rbf_kernel_by_hand():
    a = adv([0, 0, 2], kernel="rbf", bandwidth=1.0)
    e1, e4 = math.exp(-0.5), math.exp(-2.0)
    # row 0: loo p = (.5, 0, .5); row 2: loo p = (1, 0, 0)
    f0 = 1 * (0.5 - 0.5) + e1 * (0 - 0.3) + e4 * (0.5 - 0.2)
    f2 = e4 * (1 - 0.5) + e1 * (0 - 0.3) + 1 * (0 - 0.2)
    assert torch.allclose(a, torch.tensor([-f0, -f0, -f2]), atol=1e-6)


def test_plug_in_and_singleton_groups():
    assert torch.allclose(adv([0, 0, 1], leave_one_out=False), torch.tensor([0.5 - 2 / 3, 0.5 - 2 / 3, 0.3 - 1 / 3]))
    assert torch.equal(adv([0, 1], group=[0, 1]), torch.zeros(2))


def batch(group, **extras) -> RolloutBatch:
    n = len(group)
    z = torch.zeros(n, 1)
    return RolloutBatch(z, z, z, z, torch.as_tensor(group), z, z, ("correctness",), torch.ones(1), extras)


def test_estimator_as_reward_or_scaled_advantage(cfg):
    out, group = torch.tensor([0, 0, 1, 2, 2, 2]), torch.tensor([0, 0, 0, 1, 1, 1])
    b = batch(group, outcomes=out, target_probs=torch.tensor([Q] * 6))
    raw = witness_advantage(out, torch.tensor([Q] * 6), group, opts())
    rl = cfg.rl.model_copy(update={"advantage": "witness"})
    block = rl.options_for("witness").model_dump()
    assert not block["as_reward"] and block["scale"] == 1.0  # params.yaml default: the raw witness (docs/claims.md)
    assert torch.allclose(advantages.get("witness")(b, rl), raw)
    as_reward = resolve.updated(rl, "rl", options={"witness": {**block, "as_reward": True}})
    assert torch.allclose(advantages.get("witness")(b, as_reward), group_normalize(raw, group, rl.std_scaling, rl.std_eps))
    scaled = resolve.updated(rl, "rl", options={"witness": {**block, "scale": 2.0}})
    assert torch.allclose(advantages.get("witness")(b, scaled), 2.0 * raw)
    with pytest.raises(UserError, match="distribution-matching task"):
        advantages.get("witness")(batch(group), rl)


def test_registered_estimator_on_a_collapsed_group_raw_vs_as_reward(cfg):
    """Invariant 2 through the registered estimator: a group whose rollouts all land on one outcome gets q_k - 1 < 0
    from the raw witness (as_reward false, the default), and exactly 0 once the witness is group-normalised as a
    GRPO reward (as_reward true, the default before; it zeroed that group)."""
    out, group = torch.tensor([1, 1, 1, 1, 0, 2, 2, 1]), torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    b = batch(group, outcomes=out, target_probs=torch.tensor([Q] * 8))
    rl = cfg.rl.model_copy(update={"advantage": "witness"})
    block = rl.options_for("witness").model_dump()
    raw = advantages.get("witness")(b, rl)  # the default
    assert torch.allclose(raw[:4], torch.full((4,), Q[1] - 1.0)) and (raw[:4] < 0).all()
    as_reward = advantages.get("witness")(b, resolve.updated(rl, "rl", options={"witness": {**block, "as_reward": True}}))
    assert torch.equal(as_reward[:4], torch.zeros(4))  # the collapsed group's signal is gone
    assert as_reward[4:].abs().sum() > 0  # the mixed group keeps one


def test_witness_on_arithmetic_is_a_user_error(cfg):
    from posttrain.trainers.extras import outcomes

    ctx = SimpleNamespace(task=build_task(cfg.task), cfg=cfg.rl.model_copy(update={"advantage": "witness"}))
    with pytest.raises(UserError, match="^witness needs a distribution-matching task"):
        outcomes(ctx, [], None)  # the provider's own guard, behind resolve's `tasks` meta check
    with pytest.raises(UserError, match="^rl.advantage: witness needs task.name in"):
        resolve.check(cfg.model_copy(update={"rl": cfg.rl.model_copy(update={"advantage": "witness"})}))


@pytest.fixture
def task(cfg):
    return build_task(cfg.task.model_copy(update={"name": "distribution", "n_train": 30, "n_heldout": 10}))


def test_splits_are_deterministic_and_disjoint(task):
    a, b = task.splits(0), task.splits(0)
    assert a == b and len(a["train"]) == 30 and len(a["heldout"]) == 10
    assert not {e.prompt for e in a["train"]} & {e.prompt for e in a["heldout"]}
    assert a != task.splits(1)
    for e in a["train"] + a["heldout"]:
        q = task.target(e)
        assert len(q) == task.n_outcomes == 3 and math.isclose(sum(q), 1.0) and max(q) < 1.0
        assert set(e.prompt) <= set(task.alphabet()) and task.correctness_reward(e.completion, True, e) == 1.0
    too_many = build_task(task.cfg.model_copy(update={"n_train": 60, "n_heldout": 10}))
    with pytest.raises(UserError, match="distinct distributions"):
        too_many.splits(0)


def test_parse_format_correctness_and_outcome(task):
    e = Example(prompt="1=7,2=0,3=3>", completion="1", answer="13")
    assert task.target(e) == [0.7, 0.0, 0.3]
    assert [task.parse(c) for c in ["1", "3", "4", "0", "12", "", "a"]] == ["1", "3", None, None, None, None, None]
    assert task.format_reward("2", True) == 1.0 and task.format_reward("2", False) == 0.0 and task.format_reward("22", True) == 0.0
    assert [task.correctness_reward(c, True, e) for c in ["1", "2", "3", "x"]] == [1.0, 0.0, 1.0, 0.0]
    assert [task.outcome(c) for c in ["1", "3", "9"]] == [0, 2, None]


def test_total_variation_by_hand():
    assert total_variation([0, 0, 1, 1], [0.5, 0.5]) == 0.0
    assert total_variation([0, 0], [0.5, 0.5]) == 0.5
    assert math.isclose(total_variation([0, None], [1.0, 0.0]), 0.5)
    assert math.isclose(total_variation([0, 1, 2, 2], [0.5, 0.3, 0.2]), 0.5 * (0.25 + 0.05 + 0.3))


def test_witness_runs_two_steps_on_the_distribution_task(params_path):
    from posttrain import resolve
    from posttrain.models import build_tiny, train_char_tokenizer
    from posttrain.trainers.online_rl import OnlineRL, PromptStream, RLRun

    cfg = resolve.load(params_path, [
        "task.name=distribution", "task.n_train=40", "task.n_heldout=10", "model.hidden_size=32", "model.intermediate_size=64",
        "model.layers=1", "rl.advantage=witness", "rl.prompts_per_step=3", "rl.group_size=4", "rl.max_new_tokens=3",
    ])
    task = build_task(cfg.task)
    tokenizer = train_char_tokenizer([task.alphabet()])
    torch.manual_seed(0)
    model = build_tiny(cfg.model, tokenizer)
    examples = task.splits(0)["train"]
    run = RLRun(model, tokenizer, task, examples, cfg.rl, seed=0, checkpoint_dir=params_path.parent / "unused", config_hash="x")
    trainer, stream = OnlineRL(run, total_steps=2), PromptStream(examples, 0)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    signal = 0.0
    for _ in range(2):
        result = trainer.step(stream.take(3), more_prompts=stream.take)
        assert all(math.isfinite(v) for v in result.metrics.values()), result.metrics
        found = result.batch.extras["outcomes"]
        assert found.shape == (12,) and result.batch.extras["target_probs"].shape == (12, 3)
        assert 0.0 <= total_variation([None if k < 0 else int(k) for k in found], task.target(result.prompts[0])) <= 1.0
        signal += float(advantages.get("witness")(result.batch, cfg.rl).abs().sum())
    assert signal > 0  # the witness fed the update something
    assert any(not torch.equal(v, start[k]) for k, v in model.state_dict().items())  # and the two steps trained
