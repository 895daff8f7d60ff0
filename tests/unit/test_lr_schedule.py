"""`rl.lr_schedule`: after the warm-up, cosine decay to 0 at the last step (the default) or a constant rate; the
viskg and motion recipes keep the constant rate their own loops had before they ran through the core step."""

from __future__ import annotations

import pytest
import torch

from posttrain.trainers.common import optimizer_and_schedule


def _rates(schedule: str, warmup: int = 2, total: int = 10) -> list[float]:
    optimizer, sched = optimizer_and_schedule([torch.nn.Parameter(torch.zeros(3))], 1e-3, 0.0, warmup, total, schedule)
    rates = []
    for _ in range(total):
        rates.append(sched.get_last_lr()[0])
        optimizer.step()
        sched.step()
    return rates


def test_cosine_decays_to_zero_and_constant_holds_after_the_same_warmup():
    cosine, constant = _rates("cosine"), _rates("constant")
    assert cosine[:3] == constant[:3] == pytest.approx([0.0, 5e-4, 1e-3])
    assert constant[2:] == pytest.approx([1e-3] * 8)
    assert all(a > b for a, b in zip(cosine[2:], cosine[3:])) and cosine[-1] < 1e-4


def test_the_rl_section_validates_the_schedule_name():
    from posttrain.config import RLConfig

    assert RLConfig().lr_schedule == "cosine" and RLConfig(lr_schedule="constant").lr_schedule == "constant"
    with pytest.raises(ValueError, match="lr_schedule"):
        RLConfig(lr_schedule="linear")


@pytest.mark.parametrize("recipe", ["viskg", "motion"])
def test_the_vision_recipes_train_at_a_constant_rate(recipe):
    import importlib

    from posttrain.resolve import load
    from helpers import REPO

    trainer = importlib.import_module(f"posttrain.recipes.{recipe}.trainer")
    cfg = load(REPO / "recipes" / recipe / "params.yaml", stage=f"{recipe}_grpo" if recipe == "motion" else "viskg_rl")
    assert trainer.rl_settings(getattr(cfg, recipe).rl).lr_schedule == "constant"
