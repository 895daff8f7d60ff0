"""Preset `rfpo` (`rl.preset: rfpo`), registered in the core presets registry (objectives/presets.py) on import."""

from __future__ import annotations

from typing import Any

from posttrain.objectives.presets import presets


@presets.register("rfpo")
def rfpo(rl: dict[str, Any]) -> dict[str, Any]:
    """RFPO (Reward-Free Policy Optimization, 2026): the frozen critic of the `critic` stage (rl.critic.path, default
    outputs/critic) as the only reward (`rfpo`: binarised, length-debiased V(s_L)) and as the GAE baseline; no value
    loss, no verifier."""
    critic = dict(rl.get("critic") or {})
    critic["path"] = critic.get("path") or "outputs/critic"
    aux = [a for a in (rl.get("aux") or []) if a != "value"]
    return {"advantage": "gae", "loss": "clip", "loss_agg": "token_mean", "aux": aux, "rewards": [{"name": "rfpo", "weight": 1.0}], "critic": critic,
            "verify_rollouts": False}
