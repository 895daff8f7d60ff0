"""RFPO (Reward-Free Policy Optimization, 2026): the reward-free reward from a frozen critic, its invariants on hand-made values, and an API-level
check that an RL step under preset `rfpo` reads no ground truth (no verifier call, no reference answer)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from helpers import REPO, micro_params
from posttrain import resolve
from posttrain.models.value import critic_from_policy, save_critic
from posttrain.objectives import advantages
from posttrain.recipes.rfpo.reward import RFPOOptions, length_baseline, rfpo_scores
from posttrain.trainers.online_rl import OnlineRL, PromptStream, RLRun

OPTS = RFPOOptions(tau=0.0, bins=None, binarize=True)


def values_and_lengths(seed: int = 0, n: int = 64, max_len: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, generator=g, dtype=torch.float64), torch.randint(1, max_len + 1, (n,), generator=g)


def test_reward_is_binary_and_centred_per_length():
    v, lengths = values_and_lengths()
    r = rfpo_scores(v, lengths, 6, OPTS)
    assert set(r.unique().tolist()) == {0.0, 1.0}
    b = length_baseline(v, lengths, 6, None)
    for length in lengths.unique():  # b(L) is the mean score at that length: some above, some not
        rows = lengths == length
        assert torch.allclose(b[rows], v[rows].mean().expand(int(rows.sum())))
    assert torch.equal(r, (v - b > 0).double())


@pytest.mark.parametrize("shift", [lambda L: 0.3 * L, lambda L: torch.log(L.double()), lambda L: -((L - 3.0) ** 2)])
def test_adding_a_function_of_length_to_v_leaves_the_reward_unchanged(shift):
    v, lengths = values_and_lengths(1)
    assert torch.equal(rfpo_scores(v, lengths, 6, OPTS), rfpo_scores(v + shift(lengths), lengths, 6, OPTS))
    # the raw score is not invariant: this is the length exploit the debiasing removes
    raw = RFPOOptions(tau=0.0, bins=None, binarize=False)
    assert not torch.equal(rfpo_scores(v, lengths, 6, raw), rfpo_scores(v + shift(lengths), lengths, 6, raw))


def test_with_length_bins_a_shift_constant_on_each_bin_leaves_the_reward_unchanged():
    v, lengths = values_and_lengths(2, n=128, max_len=12)
    opts = RFPOOptions(tau=0.0, bins=3, binarize=True)  # bins {1..4}, {5..8}, {9..12}
    per_bin = torch.tensor([0.7, -0.2, 1.5], dtype=torch.float64)[((lengths - 1) * 3 // 12)]
    assert torch.equal(rfpo_scores(v, lengths, 12, opts), rfpo_scores(v + per_bin, lengths, 12, opts))


def test_truncated_and_complete_rollouts_are_scored_by_one_rule():
    # rows 0-3 finished (EOS inside the budget), rows 4-7 cut at the budget T_c = 6: the reward reads only
    # (V at the last state, length), so a complete rollout gets exactly the unfinished-prefix rule at its length
    v = torch.tensor([0.9, 0.2, 0.6, 0.4, 0.8, 0.1, 0.7, 0.3], dtype=torch.float64)
    lengths = torch.tensor([3, 3, 6, 6, 6, 6, 6, 6])
    r = rfpo_scores(v, lengths, 6, OPTS)
    b6 = v[lengths == 6].mean()
    assert r.tolist() == [1.0, 0.0, float(0.6 > b6), float(0.4 > b6), float(0.8 > b6), 0.0, float(0.7 > b6), 0.0]
    swapped = torch.tensor([4, 5, 6, 7, 0, 1, 2, 3])  # which rows finished does not enter: permuting rows permutes rewards
    assert torch.equal(rfpo_scores(v[swapped], lengths[swapped], 6, OPTS), r[swapped])


@pytest.fixture(scope="module")
def rfpo_micro(tmp_path_factory):
    from posttrain.models import build_tiny, train_char_tokenizer
    from posttrain.tasks import build_task

    root = tmp_path_factory.mktemp("rfpo")
    base = resolve.load(micro_params(root), [])
    task = build_task(base.task)
    tokenizer = train_char_tokenizer([task.alphabet()])
    torch.manual_seed(0)
    model = build_tiny(base.model, tokenizer)
    critic = critic_from_policy(model)
    with torch.no_grad():  # a critic whose values differ between rollouts (a zero head would score all alike)
        critic.score.weight.normal_(0.0, 2.0, generator=torch.Generator().manual_seed(3))
    save_critic(critic, root / "critic" / "model")
    tokenizer.save_pretrained(root / "critic" / "model")
    cfg = resolve.load(micro_params(root), ["rl.preset=rfpo", f"rl.critic.path={root / 'critic'}", "rl.max_new_tokens=4",
                                             "rl.prompts_per_step=3", "rl.group_size=4"])
    return cfg, task, task.splits(0)["train"][:50], tokenizer, {k: v.clone() for k, v in model.state_dict().items()}, model


def one_step(micro, examples, task):
    cfg, _, _, tokenizer, state, model = micro
    model.load_state_dict(state)
    run = RLRun(model, tokenizer, task, examples, cfg.rl, seed=0, checkpoint_dir=REPO / "unused", config_hash="x")
    trainer = OnlineRL(run, total_steps=1)
    result = trainer.step(PromptStream(examples, 0).take(cfg.rl.prompts_per_step))
    return trainer, result


def test_the_rfpo_preset_trains_with_no_ground_truth_in_the_step(rfpo_micro):
    cfg, task, examples, *_ = rfpo_micro
    assert (cfg.rl.advantage, cfg.rl.aux, [r.name for r in cfg.rl.rewards]) == ("gae", (), ["rfpo"])
    _, honest = one_step(rfpo_micro, examples, task)

    class NoVerifier(type(task)):  # any verifier call (correctness, parse) fails the step
        def correctness_reward(self, *a, **k):
            raise AssertionError("the verifier was called in the training step")

        def parse(self, *a, **k):
            raise AssertionError("the verifier was called in the training step")

    blind = NoVerifier(task.cfg)
    scrambled = [dataclasses.replace(e, answer="#" + str(e.answer), completion="?") for e in examples]  # wrong references
    trainer, result = one_step(rfpo_micro, scrambled, blind)
    batch = result.batch
    assert torch.equal(batch.rewards, honest.batch.rewards) and torch.equal(batch.completion_ids, honest.batch.completion_ids)
    assert set(batch.rewards.unique().tolist()) <= {0.0, 1.0} and batch.rewards.std() > 0  # binary and not degenerate
    adv = advantages.get("gae")(batch, cfg.rl)
    assert adv.abs().sum() > 0 and "accuracy" not in result.metrics  # no verifier reward, so no accuracy figure
    # the frozen critic: the GAE baseline, outside the optimiser, unchanged by the step
    assert trainer.critic is None and not any(p.requires_grad for p in trainer.models["critic"].parameters())
    assert "value/loss" not in result.metrics


def test_the_rfpo_experiment_arms_resolve_to_the_methods_they_name(tmp_path):
    import sys

    sys.path.insert(0, str(REPO / "experiments"))
    import rfpo_vs_ppo

    cfg = resolve.load(micro_params(tmp_path), [])
    arms = {arm: resolve.updated(cfg.rl, "rl", **rfpo_vs_ppo.arm_settings(cfg, arm, tmp_path / "critic")) for arm in rfpo_vs_ppo.ARMS}
    assert (arms["ppo"].advantage, arms["ppo"].aux, arms["ppo"].critic.path) == ("gae", ("value",), None)
    for arm, binary in (("rfpo", True), ("rfpo_raw", False)):
        rl = arms[arm]
        assert ([r.name for r in rl.rewards], rl.aux, rl.critic.path) == (["rfpo"], (), str(tmp_path / "critic"))
        assert rl.options_for("rfpo").binarize is binary
    # the claims harness compares the arms by their table rows: RFPO vs its start, supervised PPO and the raw score
    from _claims import COMPARISONS

    assert {(c.better, c.worse) for c in COMPARISONS["rfpo_vs_ppo"]} == {("rfpo", "sft"), ("rfpo", "ppo"), ("rfpo", "rfpo_raw")}


def test_the_reward_reads_the_critic_at_the_state_it_was_trained_on(rfpo_micro):
    """The `rfpo` reward, called as the RL step calls it (reward_matrix with reward_context), scores V(s_L) of the
    sampled token ids: the state the critic stage regressed, row for row, also where the policy produced a special
    token mid-completion (this untrained policy does; decoding the text drops it, and the critic would be read at a
    state it never saw)."""
    from types import SimpleNamespace

    from posttrain.models import load_tokenizer
    from posttrain.models.value import final_values, load_critic, state_values
    from posttrain.recipes.rfpo.trainer import labelled_rollouts
    from posttrain.rewards import reward_matrix
    from posttrain.trainers.extras import reward_context

    cfg, task, examples, tokenizer, state, model = rfpo_micro
    model.load_state_dict(state)
    critic = load_critic(cfg.rl.critic.path + "/model", "cpu").eval()
    tok = load_tokenizer(cfg.rl.critic.path + "/model")
    data = labelled_rollouts(model, tok, task, examples[:6], 4, 6, 1.0, torch.Generator().manual_seed(0))
    trained_on = final_values(state_values(critic, data.prompt_ids, data.prompt_mask, data.completion_ids, data.attention_mask),
                              data.attention_mask).clamp(0, 1)
    real = [ids[mask.bool()] for ids, mask in zip(data.completion_ids, data.attention_mask)]
    texts = [tok.decode(ids, skip_special_tokens=True) for ids in real]
    finished = [bool((ids == tok.eos_token_id).any()) for ids in real]
    specials = {tok.pad_token_id, tok.bos_token_id} - {None}
    assert any(any(t in specials for t in ids.tolist()) for ids in real)  # the case the text path got wrong
    raw = resolve.updated(cfg.rl, "rl", options={"rfpo": {"binarize": False}})
    samples = SimpleNamespace(completion_ids=data.completion_ids, completion_mask=data.attention_mask, attention=data.attention_mask)
    rows = [e for e in examples[:6] for _ in range(4)]
    scores, names, _ = reward_matrix(raw.rewards, task, rows, texts, finished, **reward_context(raw, samples))
    assert names == ("rfpo",)
    torch.testing.assert_close(scores[:, 0].float(), trained_on.float())
