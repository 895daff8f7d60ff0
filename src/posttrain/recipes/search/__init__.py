"""Agentic search RL on the core `search` task (issue 19; docs/search.md, docs/asct.md): two methods.

ASCT (specs §24): the recoverable-environment view of the search task (`recoverable`, `search_tree`), the credit
formulas (`asct_objective`), the actors (`asct_actors`, registry `asct_actors`), the trainer and its credit arms
(`asct_trainer`, registry `asct_credits`) and the stage `asct` (`asct_stages`); the auxiliary tree is the core's
rollout/tree.py.
BRIDGE (specs §13): the retriever as the upper level of a bilevel problem (`bridge_objective`, `bridge_trainer`) and
the stage `bridge` (`bridge_stages`); the retrievers are the core's envs/retrievers.py.
Their settings sections `asct` and `bridge` (`settings`). Pipeline: recipes/search/dvc.yaml.

Loaded as the plugin entry point `search` (pyproject.toml, `posttrain.recipes.search:register`): importing it registers
the sections and the stages; `register` adds the recipe's own registries `asct_credits` and `asct_actors`.
"""

from collections.abc import MutableMapping

from posttrain.recipes.search import asct_stages, bridge_stages, settings  # noqa: F401  (registers the sections and the stages)
from posttrain.recipes.search.asct_actors import actors
from posttrain.recipes.search.asct_trainer import credits
from posttrain.registry import Registry


def register(registries: MutableMapping[str, Registry]) -> None:
    """Add the registries only this recipe uses (the names `asct.credit` and `asct.actor` are checked against)."""
    registries["asct_credits"] = credits
    registries["asct_actors"] = actors
