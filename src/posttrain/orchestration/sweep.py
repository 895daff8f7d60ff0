"""The arms of an objective sweep (the Airflow `posttrain_sweep` DAG, the Kubeflow `sweep` pipeline).

An arm is a registry name. A preset (`rl.preset`, objectives/presets.py) names a whole method — `dr_grpo` is its
advantage AND its `token_sum_norm` aggregation, `dapo` its clip range, dynamic sampling and overlong reward —
so an arm that is a preset runs with every key the preset sets. Any other arm is an advantage estimator
(`rl.advantage`), run with the rest of the run's `rl` settings and no preset. A preset's name wins over an
advantage of the same name. Arms are unique: two of the same name would write one output folder.

Each arm's MLflow runs carry the tag `arm` (its name), which is what `compare` groups by.
"""

from __future__ import annotations

from posttrain.errors import UserError


def _presets_and_advantages():
    """The presets and advantage registries with the recipes' and plugins' entries (a recipe's preset is an arm too)."""
    from posttrain.resolve import all_registries

    registries = all_registries()
    return registries["presets"], registries["advantages"]


def arm_names() -> list[str]:
    """Every name an arm can take: the presets and the advantage estimators, sorted."""
    presets, advantages = _presets_and_advantages()
    return sorted(set(presets.names()) | set(advantages.names()))


def arm_overrides(arm: str) -> list[str]:
    """The `--set` overrides that make the run settings those of `arm` (a UserError naming it if unknown)."""
    presets, advantages = _presets_and_advantages()
    if arm in presets:
        return [f"rl.preset={arm}"]
    if arm in advantages:
        return ["rl.preset=null", f"rl.advantage={arm}"]
    raise UserError(f"sweep arm {arm!r} is neither a preset nor an advantage estimator (arms: {', '.join(arm_names())})")


def check_arms(arms: list[str] | tuple[str, ...], where: str = "sweep objectives") -> None:
    """At least one arm, each a known name, none twice."""
    if not arms:
        raise UserError(f"{where}: give at least one arm")
    seen: set[str] = set()
    for arm in arms:
        if arm in seen:
            raise UserError(f"{where}: {arm!r} is listed twice (each arm writes its own output folder)")
        seen.add(arm)
        arm_overrides(arm)
