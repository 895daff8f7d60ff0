"""CARE, Context-Adaptive Rubric Evolution (2026; docs/reward_models.md): the `dialogue` task (`dialogue`), the rubric
format and the rubric task (`rubric`), the rubric generator's trainer (`trainer`), the `care` reward with its registry
of weight sources `care_weight_sources` (`reward`), the stage `care` (`stages`) and the settings section `care`
(`settings`). Pipeline: the `care` stage of recipes/rlhf/dvc.yaml (settings: recipes/rlhf/params.yaml).
Loaded as the plugin entry point `care` (pyproject.toml): importing it registers the task, the reward, the stage and
the section; `register` adds the recipe's own registry `care_weight_sources` to the registries.
"""

from collections.abc import MutableMapping

from posttrain.recipes.care import dialogue, reward, settings, stages  # noqa: F401  (registers the task, the reward, the section and the stage)
from posttrain.recipes.care.reward import care_weight_sources
from posttrain.registry import Registry


def register(registries: MutableMapping[str, Registry]) -> None:
    """The plugin entry point: the recipe brings its registry of weight sources (`rl.options.care.source`)."""
    registries["care_weight_sources"] = care_weight_sources
