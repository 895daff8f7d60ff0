"""The image recipe, CrossTimeEdit on VIGOR-his (docs/images.md): a synthetic city with known truth (`vigor.synthetic`),
VIGOR-his curation (`vigor`: pairing, screening, change labels, instructions), the conditional flow-matching image
model (`flow`, `flux`), its SFT (`sft`) and Flow-GRPO (`grpo`) with the image judges (`rewards`, `eval`), the stages
city, curate, flow_sft, flow_rl and flow_eval (`stages`) and the settings sections city, curate, flow, flow_sft,
flow_rl and flow_eval (`settings`). Pipeline: recipes/image/dvc.yaml.

Loaded as the plugin entry point `image` (pyproject.toml, `posttrain.recipes.image:register`): importing it
registers the stages, the sections and the `flux` flow backend; `register` adds the recipe's own registries.
"""

from __future__ import annotations

from collections.abc import MutableMapping

from posttrain.recipes.image import flux, settings, stages  # noqa: F401  (registers the flux kind, the sections and the stages)
from posttrain.recipes.image.flow import flow_backends
from posttrain.recipes.image.rewards import image_rewards
from posttrain.recipes.image.vigor.steps import change_classifiers, embedders, geometric_checks, instruction_writers
from posttrain.registry import Registry


def register(registries: MutableMapping[str, Registry]) -> None:
    """Add the registries only this recipe uses (its settings sections mark them `Registered(...)`)."""
    registries.update(flow_backends=flow_backends, image_rewards=image_rewards, embedders=embedders,
                      geometric_checks=geometric_checks, change_classifiers=change_classifiers,
                      instruction_writers=instruction_writers)
