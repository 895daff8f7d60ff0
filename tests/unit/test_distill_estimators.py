"""OPD, GATS, SIPO and UniOPSD: every listed invariant on hand-made tensors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from posttrain import resolve
from posttrain.objectives import advantages
from posttrain.objectives.distill.gats import GATSOptions, GATSState, gap_weight
from posttrain.objectives.distill.opd import opd_token_advantage
from posttrain.objectives.distill.sipo import redistribution, sipo_advantage
from posttrain.objectives.distill.uniopsd import (
    StepTier, TrustState, UniOPSDOptions, c_star, fused_advantage, reliability, step_tier_from, token_lambda,
)
from posttrain.objectives.grpo import group_normalize
from posttrain.rollout import RolloutBatch

PARAMS = Path(__file__).resolve().parents[2] / "params.yaml"
RL = resolve.load(PARAMS).rl


def rl(**options):
    return resolve.updated(RL, "rl", options=options, std_scaling="group", std_eps=1e-4)


def make_batch(rewards, T=4, lengths=None, group=None, **extras) -> RolloutBatch:
    r = torch.as_tensor(rewards, dtype=torch.float32)[:, None]
    B = r.shape[0]
    lengths = lengths or [T] * B
    mask = (torch.arange(T)[None, :] < torch.as_tensor(lengths)[:, None]).long()
    return RolloutBatch(
        prompt_ids=torch.zeros(B, 2, dtype=torch.long), prompt_mask=torch.ones(B, 2, dtype=torch.long),
        completion_ids=torch.zeros(B, T, dtype=torch.long), completion_mask=mask,
        group=torch.as_tensor(group if group is not None else [0] * B), old_logp=-torch.rand(B, T, generator=torch.Generator().manual_seed(0)),
        rewards=r, reward_names=("correctness",), reward_weights=torch.ones(1), extras=extras,
    )


def grpo_tokens(batch, cfg):
    return advantages.get("grpo")(batch, cfg)[:, None] * batch.completion_mask


# --- OPD -------------------------------------------------------------------------------------------------

def test_opd_is_zero_when_teacher_and_student_agree_and_masks_padding():
    batch = make_batch([1.0, 0.0, 0.0], lengths=[4, 2, 3])
    batch = batch.with_extras(teacher_logp=batch.old_logp.clone())
    assert torch.equal(advantages.get("opd")(batch, rl()), torch.zeros(3, 4))
    teacher = batch.old_logp + 0.5
    adv = opd_token_advantage(teacher, batch.old_logp, batch.completion_mask)
    assert torch.allclose(adv, 0.5 * batch.completion_mask.float())


def test_opd_teacher_with_gradient_is_refused():
    student = torch.zeros(2, 3)
    with pytest.raises(AssertionError, match="gradient"):
        opd_token_advantage(torch.zeros(2, 3, requires_grad=True), student, torch.ones(2, 3))


def test_opd_sampled_reverse_kl_estimate_is_nonnegative_in_expectation():
    # E_{y~p_S}[logp_S - logp_T] = KL(p_S || p_T) >= 0, so the mean OPD advantage is <= 0 under exact expectation
    logits_s, logits_t = torch.randn(5, 7), torch.randn(5, 7)
    ls, lt = logits_s.log_softmax(-1), logits_t.log_softmax(-1)
    expected_adv = (ls.exp() * (lt - ls)).sum(-1)
    assert (expected_adv <= 1e-7).all()


def test_opd_with_zero_weight_and_reward_weight_one_is_grpo():
    batch = make_batch([1.0, 0.0, 0.0, 1.0]).with_extras(teacher_logp=torch.zeros(4, 4))
    cfg = rl(opd={"weight": 0.0, "reward_weight": 1.0})
    assert torch.allclose(advantages.get("opd")(batch, cfg), grpo_tokens(batch, cfg))


# --- GATS ------------------------------------------------------------------------------------------------

OPTS = GATSOptions(w_max=1.0, mu=0.9, g_0=1.0, latch=True, teacher_success=0.6, eps=1e-6)


def test_gats_weight_is_non_increasing_full_at_zero_and_zero_past_the_teacher():
    grid = [i / 100 for i in range(101)]
    w = [gap_weight(s, 0.6, OPTS) for s in grid]
    assert all(a >= b for a, b in zip(w, w[1:]))
    assert w[0] == OPTS.w_max
    assert all(x == 0.0 for s, x in zip(grid, w) if s >= 0.6)


def test_gats_latch_keeps_the_weight_at_zero():
    state = GATSState(teacher_success=0.6)
    weights = []
    for success in [0.1, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0]:
        state.update(success, OPTS)
        weights.append(gap_weight(state.student_success, state.teacher_success, OPTS, state.latched))
    first_zero = weights.index(0.0)
    assert first_zero > 0 and all(w == 0.0 for w in weights[first_zero:])
    unlatched = GATSOptions(**{**OPTS.model_dump(), "latch": False})
    state = GATSState(teacher_success=0.6, student_success=0.7)
    for _ in range(20):
        state.update(0.0, unlatched)
    assert gap_weight(state.student_success, 0.6, unlatched, state.latched) > 0


def test_gats_with_zero_weight_is_reward_only_grpo_and_opd_term_vanishes_when_teacher_equals_student():
    batch = make_batch([1.0, 0.0, 0.0, 1.0])
    cfg = rl()
    zero_w = batch.with_extras(teacher_logp=batch.old_logp - 1.0, gats_weight=torch.zeros(4))
    assert torch.allclose(advantages.get("gats")(zero_w, cfg), grpo_tokens(batch, cfg))
    same = batch.with_extras(teacher_logp=batch.old_logp.clone(), gats_weight=torch.ones(4))
    assert torch.allclose(advantages.get("gats")(same, cfg), grpo_tokens(batch, cfg))


# --- SIPO ------------------------------------------------------------------------------------------------

def test_sipo_keeps_each_rollouts_sequence_direction_even_when_clipping_binds():
    batch = make_batch([1.0, 0.0, 0.0, 1.0], T=5, lengths=[5, 3, 4, 2])
    gap = torch.randn(4, 5, generator=torch.Generator().manual_seed(1)) * 5  # large: the +-c rail binds
    seq = advantages.get("grpo")(batch, rl())
    adv = sipo_advantage(seq, gap, batch.completion_mask, lam=0.5, clip=1.0)
    m = batch.completion_mask.float()
    assert torch.allclose(((adv - seq[:, None]) * m).sum(-1), torch.zeros(4), atol=1e-5)
    assert (adv * (1 - m) == 0).all()


def test_sipo_identical_contexts_or_zero_lambda_is_grpo():
    batch = make_batch([1.0, 0.0, 0.0, 1.0])
    cfg = rl()
    same = batch.with_extras(contrast_logp_gap=torch.zeros(4, 4))
    assert torch.allclose(advantages.get("sipo")(same, cfg), grpo_tokens(batch, cfg))
    varied = batch.with_extras(contrast_logp_gap=torch.randn(4, 4))
    assert torch.allclose(advantages.get("sipo")(varied, rl(sipo={"lam": 0.0})), grpo_tokens(batch, cfg))


def test_sipo_a_token_independent_bias_in_both_teachers_cancels():
    pos, neg = torch.randn(3, 4), torch.randn(3, 4)
    bias = torch.randn(3, 4)  # e.g. a per-position shift both contexts share (a hint's mere presence)
    mask = torch.ones(3, 4)
    assert torch.allclose(redistribution((pos + bias) - (neg + bias), mask, 2.0), redistribution(pos - neg, mask, 2.0), atol=1e-6)


def test_sipo_context_labels_differ_from_the_prompt_separator():
    """C+ frames the reference as correct with a label that is not the separator, so "<ref><CORRECT><SEP><prompt>"
    is not "<ref><SEP><SEP><prompt>" (the reference followed by an empty privileged segment)."""
    from posttrain.tasks import Example
    from posttrain.trainers import contexts

    assert len({contexts.CORRECT, contexts.INCORRECT, contexts.SEP}) == 3
    e = Example(prompt="7*8", completion="56", answer="56")
    pos, neg = contexts.contrastive_contexts(e, ["54"])
    assert pos == f"56{contexts.CORRECT}54{contexts.INCORRECT}{contexts.SEP}7*8" and neg == f"56{contexts.INCORRECT}54{contexts.CORRECT}{contexts.SEP}7*8"
    assert pos.split(contexts.SEP) == [f"56{contexts.CORRECT}54{contexts.INCORRECT}", "7*8"]  # one separator: the labels are not it
    assert len(pos) == len(neg) and sum(a != b for a, b in zip(pos, neg)) == 2


def test_sipo_gives_signal_in_an_all_fail_group_where_grpo_gives_none():
    batch = make_batch([0.0, 0.0, 0.0, 0.0]).with_extras(contrast_logp_gap=torch.randn(4, 4))
    cfg = rl()
    assert torch.equal(advantages.get("grpo")(batch, cfg), torch.zeros(4))
    adv = advantages.get("sipo")(batch, cfg)
    assert adv.abs().sum() > 0
    assert torch.allclose(adv.sum(-1), torch.zeros(4), atol=1e-5)  # still zero net push per rollout


# --- UniOPSD ---------------------------------------------------------------------------------------------

UOPTS = UniOPSDOptions(lam0=0.5, warmdown_steps=100, eps_w=0.2, a_reliability=0.5, rho_decay=0.9, rho_shrink_z=2.33, step_advantage_w=1.0,
                       gamma=0.95, mode="mean_norm", anchor="observation", eps=1e-6)


def tier_and_gap(seed=0):
    g = torch.Generator().manual_seed(seed)
    returns = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    anchor = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    gap = torch.randn(8, 5, generator=g) * 0.5
    gap[6:] = 0.0  # two rows without a teacher
    mask = torch.ones(8, 5, dtype=torch.long)
    a_episode = group_normalize(returns, anchor, "group", 1e-4)
    return step_tier_from(a_episode, returns, anchor, gap, mask, 1.0, "group", 1e-4, 1e-6), gap, mask


def test_uniopsd_full_trust_in_the_step_advantage_is_the_decoupled_form():
    tier, gap, mask = tier_and_gap()
    c = reliability(tier, c_star(0.0, 0.5))
    assert torch.equal(c, torch.ones(8))
    lam = 0.5
    w = torch.clamp(torch.exp(torch.sign(tier.a_step)[:, None] * gap), 0.8, 1.2)
    decoupled = tier.a_episode[:, None] + tier.a_step[:, None] * ((1 - lam) + lam * w)
    assert torch.allclose(fused_advantage(tier, c, gap, mask, lam, 0.2), decoupled)


def test_uniopsd_zero_lambda_drops_the_token_modulation_and_weights_stay_bounded_and_signed():
    tier, gap, mask = tier_and_gap(1)
    c = reliability(tier, c_star(0.6, 0.5))
    fused = c * tier.a_step + (1 - c) * tier.a_teacher
    assert torch.allclose(fused_advantage(tier, c, gap, mask, 0.0, 0.2), (tier.a_episode + fused)[:, None].expand(8, 5))
    step_credit = fused_advantage(tier, c, gap, mask, 0.5, 0.2) - tier.a_episode[:, None]
    ratio = step_credit / fused[:, None].where(fused[:, None] != 0, torch.ones(1))
    assert ((ratio >= 0.9 - 1e-6) & (ratio <= 1.1 + 1e-6))[fused != 0].all()  # (1 - lam) + lam w with w in [0.8, 1.2]
    assert (torch.sign(step_credit) == torch.sign(fused)[:, None]).all()


def test_uniopsd_c_star_bounds_and_the_median_row_gets_c_star():
    values = [c_star(r, 0.5) for r in [0.0, 0.2, 0.4, 0.6, 0.7, 0.9, 1.0]]
    assert values[0] == 1.0 and all(0.0 <= v <= 1.0 for v in values)
    assert all(a >= b for a, b in zip(values, values[1:]))
    tier = StepTier(
        a_episode=torch.zeros(3), a_step=torch.ones(3), a_teacher=torch.ones(3), prec_step=torch.tensor([1.0, 2.0, 4.0]),
        prec_teacher=torch.tensor([3.0, 6.0, 12.0]), has_step=torch.ones(3, dtype=torch.bool), has_teacher=torch.ones(3, dtype=torch.bool),
    )
    cstar = c_star(0.6, 0.5)
    assert reliability(tier, cstar)[1].item() == pytest.approx(cstar)


def test_uniopsd_episode_tier_is_untouched_and_untaught_rows_get_episode_plus_step():
    tier, gap, mask = tier_and_gap(2)
    for rho in (0.0, 0.5, 0.9):
        c = reliability(tier, c_star(rho, 0.5))
        adv = fused_advantage(tier, c, gap, mask, 0.5, 0.2)
        untaught = ~tier.has_teacher
        assert torch.allclose(adv[untaught], (tier.a_episode + tier.a_step)[untaught][:, None].expand(-1, 5))
        tier_other = StepTier(tier.a_episode + 3.0, *list(tier.__dict__.values())[1:])
        assert torch.allclose(fused_advantage(tier_other, c, gap, mask, 0.5, 0.2) - adv, torch.full_like(adv, 3.0))


def test_uniopsd_trust_state_starts_at_zero_then_tracks_correlation_and_lambda_warms_down():
    state = TrustState()
    assert state.rho_used(UOPTS) == 0.0
    x = torch.randn(64, generator=torch.Generator().manual_seed(3))
    state.update(x, 2 * x + 0.01 * torch.randn(64), torch.ones(64, dtype=torch.bool), UOPTS)
    assert 0.5 < state.rho_used(UOPTS) < 1.0
    assert token_lambda(0, UOPTS) == 0.5 and token_lambda(50, UOPTS) == pytest.approx(0.25) and token_lambda(100, UOPTS) == 0.0


def test_uniopsd_estimator_on_a_batch_is_episode_plus_token_weighted_step_credit():
    """The registered estimator end to end, by hand: with no trust history (rho 0, c* = 1) the step credit is the
    environment's A^S, modulated per token by the peer teacher's gap; once the teacher is trusted (rho high) its
    own step estimate A^O enters and the advantage changes."""
    cfg = rl()
    opts = cfg.options_for("uniopsd")
    gap = torch.randn(4, 4, generator=torch.Generator().manual_seed(0)) * 0.3
    batch = make_batch([1.0, 0.0, 0.0, 1.0]).with_extras(peer_logp_gap=gap, uniopsd_rho=torch.tensor(0.0), train_step=torch.tensor(1.0))
    adv = advantages.get("uniopsd")(batch, cfg)
    r = torch.tensor([1.0, 0.0, 0.0, 1.0])
    a_e = r - r.mean()  # mode mean_norm; one step per single-turn rollout, its anchor the prompt: A^S = omega A^E
    a_s = opts.step_advantage_w * a_e
    w = torch.clamp(torch.exp(torch.sign(a_s)[:, None] * gap), 1 - opts.eps_w, 1 + opts.eps_w)
    lam = opts.lam0  # first update: no warm-down yet
    torch.testing.assert_close(adv, a_e[:, None] + a_s[:, None] * ((1 - lam) + lam * w))
    assert (adv[:, 1:] != adv[:, :1]).any()  # the teacher's gap moves the credit between tokens
    trusted = advantages.get("uniopsd")(batch.with_extras(uniopsd_rho=torch.tensor(0.7)), cfg)
    assert not torch.allclose(trusted, adv)


# --- edge cases every estimator must survive (spec Appendix B) -------------------------------------------

NEUTRAL = {  # teacher tensors that carry no information: each estimator then reduces to its reward part
    "teacher_logp": None, "gats_weight": torch.ones(6), "contrast_logp_gap": torch.zeros(6, 4),
    "peer_logp_gap": torch.zeros(6, 4), "uniopsd_rho": torch.tensor(0.0), "train_step": torch.tensor(1.0),
}
NAN = float("nan")


@pytest.mark.parametrize("name", ["opd", "gats", "sipo", "uniopsd"])
@pytest.mark.parametrize("rewards,group", [
    ([1.0, 1.0, 1.0, 0.3, 0.3, 0.3], [0, 0, 0, 1, 1, 1]),  # all equal within each group
    ([1.0, 0.0, 1.0, 0.0, 1.0, 0.5], [0, 1, 2, 3, 4, 5]),  # singleton groups (G = 1)
    ([1.0, NAN, 0.0, 1.0, NAN, 0.5], [0, 0, 0, 1, 1, 1]),  # unscorable rows
])
def test_distillation_estimators_are_finite_and_leave_padding_at_zero(name, rewards, group):
    batch = make_batch(rewards, T=4, lengths=[4, 2, 3, 1, 4, 2], group=group)
    extras = {k: (batch.old_logp.clone() if v is None else v) for k, v in NEUTRAL.items()}
    batch = batch.with_extras(**extras)
    adv = advantages.get(name)(batch, rl(opd={"weight": 1.0, "reward_weight": 1.0}))
    assert adv.shape == (6, 4) and torch.isfinite(adv).all()
    assert (adv[batch.completion_mask == 0] == 0).all()
    reward_part = advantages.get("grpo")(batch, rl())
    if name != "uniopsd":  # with neutral teachers these are exactly GRPO's advantage on every produced token
        assert torch.allclose(adv, reward_part[:, None] * batch.completion_mask)
    nan_rows = torch.isnan(torch.as_tensor(rewards))
    assert (adv[nan_rows] == 0).all(), "an unscorable row gets no reward advantage"
