"""Off-policy corrections (objectives/off_policy.py) over hand-built log-probs: the identity at zero staleness, the
caps and masks where they bind, the decoupled loss against its formula, and the mismatch figures."""

from __future__ import annotations

import math

import pytest
import torch

from posttrain.objectives.loss_settings import LossSettings
from posttrain.objectives.off_policy import (
    DecoupledOptions, MISOptions, TISOptions, corrections, mismatch_figures, weighted_advantages,
)
from posttrain.objectives.icepop import IcePopOptions
from posttrain.objectives.m2po import M2POOptions
from posttrain.objectives.opsm import OPSMOptions
from posttrain.objectives.policy_losses import clipped_surrogate
from posttrain.objectives.rejection import RejectionOptions
from posttrain.objectives.sampler_is import SamplerISOptions

OPTIONS = {
    "none": None,
    "tis": TISOptions(level="token", cap=2.0),
    "mis": MISOptions(level="sequence", low=0.5, high=2.0),
    "decoupled": DecoupledOptions(cap=5.0),
    "rejection": RejectionOptions(mode="seq_mean_k3", low=0.5, high=0.01),
    "icepop": IcePopOptions(low=0.5, high=5.0),
    "sampler_is": SamplerISOptions(level="token", mode="mask", low=0.5, high=2.0),
    "opsm": OPSMOptions(delta=0.1),
    "m2po": M2POOptions(threshold=0.04, cap=5.0),
}
LOG = math.log


def cfg(agg="token_mean"):
    return LossSettings(clip_eps_low=0.2, clip_eps_high=0.2, loss_agg=agg, max_new_tokens=3)


def corrected_loss(name, logp, behaviour, proximal, adv, mask, options=None, agg="token_mean"):
    reads_adv = {"advantages": adv} if corrections.entry(name).meta.get("advantages") else {}
    fixed = corrections.get(name)(behaviour, proximal, mask, options if options is not None else OPTIONS[name], **reads_adv)
    return clipped_surrogate(logp, fixed.old_logp, weighted_advantages(adv, fixed.weight), fixed.mask, cfg(agg))[0], fixed


def test_every_registered_correction_is_tested():
    assert sorted(corrections.names()) == sorted(OPTIONS)


@pytest.mark.parametrize("name", sorted(OPTIONS))
@pytest.mark.parametrize("agg", ["token_mean", "seq_mean", "token_sum_norm"])
def test_zero_staleness_is_the_identity(name, agg):
    """Behaviour == proximal (a synchronous step): the corrected loss and its gradient equal the uncorrected ones."""
    torch.manual_seed(0)
    behaviour = torch.log_softmax(torch.randn(4, 3, 5), -1)[..., 0]
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]])
    adv = torch.tensor([1.0, -0.5, 2.0, -1.0])
    theta = (behaviour + 0.3 * torch.randn(4, 3)).requires_grad_()
    plain, _ = clipped_surrogate(theta, behaviour, adv, mask, cfg(agg))
    (grad_plain,) = torch.autograd.grad(plain, theta)
    loss, fixed = corrected_loss(name, theta, behaviour, behaviour.clone(), adv, mask, agg=agg)
    (grad,) = torch.autograd.grad(loss, theta)
    assert torch.equal(fixed.mask, mask)
    assert torch.allclose(loss, plain, atol=1e-7) and torch.allclose(grad, grad_plain, atol=1e-7)
    assert float(plain.detach()) != 0.0  # the step is not degenerate


def test_tis_truncates_at_the_cap_per_token_and_per_sequence():
    behaviour = torch.tensor([[LOG(0.1), LOG(0.4)], [LOG(0.5), LOG(0.5)]])
    proximal = torch.tensor([[LOG(0.5), LOG(0.2)], [LOG(0.6), LOG(0.6)]])  # ratios 5, 0.5 | 1.2, 1.2
    mask = torch.ones(2, 2)
    token = corrections.get("tis")(behaviour, proximal, mask, TISOptions(level="token", cap=2.0))
    assert torch.allclose(token.weight, torch.tensor([[2.0, 0.5], [1.2, 1.2]]))  # the 5 binds, the rest pass
    assert token.metrics["tis/truncated_fraction"] == 0.25
    assert torch.equal(token.old_logp, proximal) and torch.equal(token.mask, mask)
    seq = corrections.get("tis")(behaviour, proximal, mask, TISOptions(level="sequence", cap=2.0))
    assert torch.allclose(seq.weight, torch.tensor([2.0, 1.44]))  # products 2.5 -> 2, 1.44 kept
    # padding carries no ratio: the same row with a padded, wildly off token keeps its weight
    padded = corrections.get("tis")(behaviour, torch.tensor([[LOG(0.5), 0.0], [LOG(0.6), LOG(0.6)]]), torch.tensor([[1, 0], [1, 1]]),
                                    TISOptions(level="sequence", cap=10.0))
    assert torch.allclose(padded.weight, torch.tensor([5.0, 1.44]))


def test_mis_masks_ratios_outside_the_interval():
    behaviour = torch.tensor([[LOG(0.1), LOG(0.4), LOG(0.5)], [LOG(0.5), LOG(0.5), LOG(0.5)]])
    proximal = torch.tensor([[LOG(0.5), LOG(0.1), LOG(0.6)], [LOG(0.6), LOG(0.6), LOG(0.6)]])  # 5, 0.25, 1.2 | 1.2 x3
    mask = torch.ones(2, 3, dtype=torch.long)
    token = corrections.get("mis")(behaviour, proximal, mask, MISOptions(level="token", low=0.5, high=2.0))
    assert token.mask.tolist() == [[0, 0, 1], [1, 1, 1]]
    assert torch.allclose(token.weight, torch.tensor([[0.0, 0.0, 1.2], [1.2, 1.2, 1.2]]))
    assert token.metrics["mis/dropped_fraction"] == pytest.approx(2 / 6)
    seq = corrections.get("mis")(behaviour, proximal, mask, MISOptions(level="sequence", low=0.5, high=2.0))
    assert seq.mask.tolist() == [[1, 1, 1], [1, 1, 1]]  # products 1.5 and 1.728: the token outliers cancel in row 0
    assert torch.allclose(seq.weight, torch.tensor([1.5, 1.728]))
    seq = corrections.get("mis")(behaviour, proximal, mask, MISOptions(level="sequence", low=0.5, high=1.6))
    assert seq.mask.tolist() == [[1, 1, 1], [0, 0, 0]]
    assert torch.allclose(seq.weight, torch.tensor([1.5, 0.0]))


def test_decoupled_loss_is_the_weighted_surrogate_clipped_around_the_proximal_policy():
    behaviour = torch.tensor([[LOG(0.2), LOG(0.5)]])
    proximal = torch.tensor([[LOG(0.4), LOG(0.5)]])  # behaviour weights 2 and 1
    theta = torch.tensor([[LOG(0.6), LOG(0.45)]], requires_grad=True)  # r = 1.5 (clipped at 1.2), 0.9
    adv, mask = torch.tensor([1.0]), torch.ones(1, 2)
    loss, _ = corrected_loss("decoupled", theta, behaviour, proximal, adv, mask)
    expected = -(2.0 * min(1.5, 1.2) + 1.0 * 0.9) / 2
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-6)
    (grad,) = torch.autograd.grad(loss, theta)
    assert grad[0, 0] == 0 and grad[0, 1] != 0  # the clip binds around pi_prox, not around mu
    # uncorrected, the clip sits around mu: r = 3 on the first token
    plain, _ = clipped_surrogate(theta, behaviour, adv, mask, cfg())
    assert float(plain) == pytest.approx(-(1.2 + 0.9) / 2, rel=1e-6)
    capped = corrections.get("decoupled")(behaviour, proximal, mask, DecoupledOptions(cap=1.5))
    assert capped.mask.tolist() == [[0.0, 1.0]] and capped.weight.tolist() == [[0.0, 1.0]]


def test_weighted_advantages_shapes():
    adv_seq, adv_tok = torch.tensor([1.0, -2.0]), torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    assert weighted_advantages(adv_seq, None) is adv_seq
    assert weighted_advantages(adv_seq, torch.tensor([2.0, 0.5])).tolist() == [2.0, -1.0]
    assert weighted_advantages(adv_seq, torch.tensor([[2.0, 1.0], [0.5, 0.0]])).tolist() == [[2.0, 1.0], [-1.0, -0.0]]
    assert weighted_advantages(adv_tok, torch.tensor([2.0, 0.0])).tolist() == [[2.0, 4.0], [0.0, 0.0]]


def test_mismatch_figures():
    mu = torch.tensor([[LOG(0.5), LOG(0.25), 0.0]])
    mask = torch.tensor([[1, 1, 0]])
    same = mismatch_figures(mu, mu.clone(), mask)
    assert same == {"mismatch/k3": 0.0, "mismatch/max_ratio": 1.0, "mismatch/min_ratio": 1.0}
    trainer = torch.tensor([[LOG(0.25), LOG(0.5), 7.0]])  # ratios 0.5 and 2; the padded 7 is ignored
    got = mismatch_figures(mu, trainer, mask)
    k3 = ((0.5 - 1 - LOG(0.5)) + (2 - 1 - LOG(2))) / 2
    assert got["mismatch/k3"] == pytest.approx(k3) and got["mismatch/max_ratio"] == pytest.approx(2.0)
    assert got["mismatch/min_ratio"] == pytest.approx(0.5)


# ---------------------------------------------------------------- the 2026 catalogue's corrections where they bind


def stale():
    behaviour = torch.tensor([[LOG(0.1), LOG(0.4), LOG(0.5)], [LOG(0.5), LOG(0.5), LOG(0.2)]])
    proximal = torch.tensor([[LOG(0.5), LOG(0.2), LOG(0.5)], [LOG(0.6), LOG(0.6), LOG(0.2)]])  # ratios 5, .5, 1 | 1.2, 1.2, 1
    return behaviour, proximal, torch.tensor([[1, 1, 1], [1, 1, 0]])


def test_icepop_zeroes_weights_outside_the_band_and_keeps_the_mask():
    behaviour, proximal, mask = stale()
    fixed = corrections.get("icepop")(behaviour, proximal, mask, IcePopOptions(low=0.6, high=2.0))
    assert torch.allclose(fixed.weight, torch.tensor([[0.0, 0.0, 1.0], [1.2, 1.2, 0.0]]))
    assert torch.equal(fixed.mask, mask) and fixed.metrics["icepop/masked_fraction"] == 0.4


def test_sampler_is_truncates_or_masks_and_opsm_drops_only_negative_drifted_sequences():
    behaviour, proximal, mask = stale()
    trunc = corrections.get("sampler_is")(behaviour, proximal, mask, SamplerISOptions(level="token", mode="truncate", low=0.6, high=2.0))
    assert torch.allclose(trunc.weight, torch.tensor([[2.0, 0.6, 1.0], [1.2, 1.2, 0.0]]))
    masked = corrections.get("sampler_is")(behaviour, proximal, mask, SamplerISOptions(level="sequence", mode="mask", low=0.0, high=2.0))
    assert torch.allclose(masked.weight, torch.tensor([[0.0, 0.0, 0.0], [1.44, 1.44, 0.0]]))  # products 2.5 (out) and 1.44
    behaviour_far = proximal + torch.tensor([[0.5, 0.5, 0.5], [0.0, 0.0, 0.0]])  # row 0 drifted: KL 0.5
    for adv, kept in [(torch.tensor([-1.0, -1.0]), [0.0, 1.0]), (torch.tensor([1.0, -1.0]), [1.0, 1.0])]:
        fixed = corrections.get("opsm")(behaviour_far, proximal, mask, OPSMOptions(delta=0.1), advantages=adv)
        assert fixed.weight[:, 0].tolist() == kept


def test_rejection_and_m2po_take_tokens_out_of_the_mask():
    behaviour, proximal, mask = stale()
    token = corrections.get("rejection")(behaviour, proximal, mask, RejectionOptions(mode="token_k1", low=0.5, high=2.0))
    assert token.mask.tolist() == [[0, 1, 1], [1, 1, 0]]  # k1 = log(mu / pi): the 1/5 ratio leaves, 1/0.5 = 2 stays
    seq = corrections.get("rejection")(behaviour, proximal, mask, RejectionOptions(mode="seq_max_k2", low=1.0, high=0.5))
    assert seq.mask.tolist() == [[0, 0, 0], [1, 1, 0]] and seq.metrics["rejection/seq_masked_fraction"] == 0.5
    m2 = corrections.get("m2po")(behaviour, proximal, mask, M2POOptions(threshold=0.1, cap=0.0))
    assert m2.mask.tolist() == [[0, 0, 1], [1, 1, 0]]  # (log 5)^2 = 2.6 and (log 2)^2 = 0.48 go (without them 0.137 >= 0.1); the rest average 0.02
