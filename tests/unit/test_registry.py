"""The name -> implementation registries."""

from __future__ import annotations

import pytest

from posttrain.errors import UserError
from posttrain.registry import Registry
from posttrain.resolve import all_registries


def make_registry() -> Registry:
    reg: Registry = Registry("widget")
    reg.register("alpha", needs=("x",))(lambda: "a")
    reg.register("beta")(lambda: "b")
    return reg


def test_register_and_get():
    reg = make_registry()
    assert reg.get("alpha")() == "a"
    assert reg.entry("alpha").meta == {"needs": ("x",)}
    assert reg.names() == ["alpha", "beta"]
    assert "beta" in reg and "gamma" not in reg
    assert [e.name for e in reg] == ["alpha", "beta"]


def test_register_returns_the_object_unchanged():
    reg: Registry = Registry("widget")

    def f():
        return 1

    assert reg.register("f")(f) is f


def test_duplicate_register_raises():
    reg = make_registry()
    with pytest.raises(ValueError, match="alpha"):
        reg.register("alpha")(lambda: "again")
    assert reg.get("alpha")() == "a"  # the first registration survives


def test_unknown_name_suggests_close_matches():
    reg = make_registry()
    with pytest.raises(UserError) as info:
        reg.get("alpah")
    message = str(info.value)
    assert "did you mean" in message and "'alpha'" in message and "widget" in message
    assert "\n" not in message


def test_unknown_name_without_close_match_lists_choices():
    reg = make_registry()
    with pytest.raises(UserError) as info:
        reg.entry("zzzzzz")
    message = str(info.value)
    assert "did you mean" not in message
    assert "alpha" in message and "beta" in message


EXPECTED = {
    "advantages": {"grpo"},
    "losses": {"clip"},
    "loss_aggregations": {"token_mean", "seq_mean"},
    "rewards": {"correctness", "format"},
    "tasks": {"arithmetic", "text_world"},
    "stages": {"data", "sft", "rl", "eval", "distill"},
    "auxiliaries": {"opsd", "think_opd", "ride", "ride_logits", "pr_opd", "roft"},
}


def test_all_registries_are_populated():
    registries = all_registries()
    assert set(EXPECTED) <= set(registries)
    for key, names in EXPECTED.items():
        assert names <= set(registries[key].names()), key


def test_real_registry_typo_suggestion():
    with pytest.raises(UserError, match="did you mean 'token_mean'"):
        all_registries()["loss_aggregations"].get("token_men")
