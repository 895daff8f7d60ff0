"""Lifelong knowledge editing (as in GLIME, 2026; docs/editing.md): the synthetic fact set (`facts`), the edit methods
and their registry `edit_methods` (`objective`: naive; `glime`), the trainer that applies a stream of edits and
measures it (`trainer`), the stages `knowledge` and `edit` (`stages`) and the settings section `edit` (`settings`).
Pipeline: the `knowledge` and `edit` stages of recipes/rlhf/dvc.yaml (settings: recipes/rlhf/params.yaml).
Loaded as the plugin entry point `editing` (pyproject.toml): importing it registers the stages, the section and the
methods; `register` adds the recipe's own registry `edit_methods` to the registries.
"""

from collections.abc import MutableMapping

from posttrain.recipes.editing import objective, settings, stages  # noqa: F401  (registers the methods, the section and the stages)
from posttrain.recipes.editing.objective import edit_methods
from posttrain.registry import Registry


def register(registries: MutableMapping[str, Registry]) -> None:
    """The plugin entry point: the recipe brings its registry of edit methods (`edit.method`, `edit.options`)."""
    registries["edit_methods"] = edit_methods
