"""`LossSettings`: what a policy loss reads, taken from the rl section (or a recipe's) and nothing else.

A loss given the settings built from a section returns exactly what it returned given the section itself (the
trainer's numbers did not move when losses stopped taking the whole config), and a section's unresolved options
block is refused when the settings are built, not deep inside a loss."""

from __future__ import annotations

from dataclasses import FrozenInstanceError

import pytest
import torch

from posttrain import resolve
from posttrain.config import RLConfig
from posttrain.objectives import losses
from posttrain.objectives.loss_settings import LossSettings
from posttrain.objectives.respo import ReSPOOptions
from posttrain.recipes.viskg.settings import VisKGRLConfig
from helpers import REPO


def tensors(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(4, 5, generator=g) - 0.1
    logp = old + 0.3 * torch.randn(4, 5, generator=g)
    mask = (torch.rand(4, 5, generator=g) > 0.2).float()
    return logp, old, torch.randn(4, generator=g), mask


def test_of_the_rl_section_holds_its_loss_fields_and_parsed_options():
    rl = resolve.load(REPO / "params.yaml", ["rl.loss=respo", "rl.clip_eps_high=0.28", "rl.loss_agg=token_sum_norm",
                                      "rl.max_new_tokens=7", "rl.options.respo.phi_min=0.3"]).rl
    settings = LossSettings.of(rl)
    assert (settings.clip_eps_low, settings.clip_eps_high, settings.loss_agg, settings.max_new_tokens) == (0.2, 0.28, "token_sum_norm", 7)
    assert isinstance(settings.options_for("respo"), ReSPOOptions) and settings.options_for("respo").phi_min == 0.3
    assert settings.options_for("no_such_part") is None
    with pytest.raises(FrozenInstanceError):
        settings.clip_eps_low = 0.5


@pytest.mark.parametrize("name,agg", [("clip", "token_sum_norm"), ("respo", "seq_mean"), ("dual_clip", "token_mean"), ("cispo", "token_mean")])
def test_a_loss_gives_the_same_numbers_from_the_settings_as_from_the_section(name, agg):
    rl = resolve.load(REPO / "params.yaml", [f"rl.loss={name}", f"rl.loss_agg={agg}", "rl.clip_eps_high=0.28", "rl.max_new_tokens=9"]).rl
    logp, old, adv, mask = tensors()
    from_section, m_section = losses.get(name)(logp, old, adv, mask, rl)
    from_settings, m_settings = losses.get(name)(logp, old, adv, mask, LossSettings.of(rl))
    assert torch.equal(from_section, from_settings) and m_section == m_settings


def test_a_recipe_section_without_options_or_budget_gives_settings():
    viskg = VisKGRLConfig(clip_eps_low=0.1, loss_agg="seq_mean")
    settings = LossSettings.of(viskg)
    assert (settings.clip_eps_low, settings.clip_eps_high, settings.loss_agg, settings.max_new_tokens) == (0.1, 0.2, "seq_mean", 160)
    assert settings.options == {}


def test_the_budget_reaches_token_sum_norm_and_its_absence_falls_back_to_the_width():
    logp, old, adv, mask = tensors(1)
    with_budget, _ = losses.get("clip")(logp, old, adv, mask, LossSettings(loss_agg="token_sum_norm", max_new_tokens=10))
    without, _ = losses.get("clip")(logp, old, adv, mask, LossSettings(loss_agg="token_sum_norm"))
    assert torch.allclose(with_budget * 10, without * 5)  # the sum over 4 sequences divided by 4*10, against 4*5


def test_an_unresolved_options_block_is_refused_when_the_settings_are_built():
    raw = RLConfig(options={"respo": {"phi_min": 0.2}})
    with pytest.raises(RuntimeError, match="not resolved"):
        LossSettings.of(raw)
