"""Plugins: stages, settings sections, rewards, tasks, estimators, losses (any registry's parts) from installed packages.

A package declares entry points in the group `posttrain.plugins`:

    [project.entry-points."posttrain.plugins"]
    my_parts = "my_pkg.posttrain_plugin:register"   # a function: called once as register(registries)
    more = "my_pkg.more_parts"                      # a module: importing it registers (its decorators run)

`registries` is `posttrain.resolve.all_registries()` without the plugins' own parts yet: {"rewards": ...,
"advantages": ..., "losses": ..., "tasks": ..., ...}, each with `.register(name, **meta)`. Plugins load once per
process, lazily, when the registries are first gathered at the boundary (`resolve`, `posttrain registry`); no
low layer imports this module. Every entry a plugin adds gets meta `source` ("plugin <entry point> (<dist>)"),
which `posttrain registry` prints. A plugin that fails to load, or registers a name already taken, stops the run
with one line naming it.

A plugin adds a stage through `registries["stages"]` (the CLI loads the plugins before it builds its commands, and
the launchers read the same registry) and a settings section through `registries["sections"]`
(`.register("my_section", help=..., default=...)(MySettings)`, a `config.Section` model): `params.yaml` and
`--set my_section.key=...` then take it, and the stages that declare it (`.register("my_stage", sections=("my_section",),
...)`) read `cfg.my_section`; a stage's settings hold the core sections and those it declares, so a bad value in
another recipe's section does not stop it. posttrain's own recipes
(`posttrain.recipes.<name>`) are entry points of this group too.
"""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping
from importlib.metadata import EntryPoint, entry_points
from types import ModuleType

from posttrain.errors import UserError
from posttrain.registry import Registry

GROUP = "posttrain.plugins"
_loaded = False


_brought: dict[str, Registry] = {}  # the registries plugins brought (recipes' own kinds), kept for every later call


def load(registries: MutableMapping[str, Registry]) -> None:
    """Register every installed plugin's parts into `registries`, the first time only; add the registries plugins
    brought, every time."""
    global _loaded
    if not _loaded:
        _loaded = True  # set first: a plugin that gathers the registries itself must not load the plugins again
        core = set(registries)
        register_plugins(registries, entry_points(group=GROUP))
        _brought.update({key: registry for key, registry in registries.items() if key not in core})
    registries.update(_brought)


def source_of(point: EntryPoint) -> str:
    dist = getattr(point, "dist", None)
    if point.value.startswith("posttrain.recipes."):  # posttrain's own recipes load the way a plugin does
        return f"recipe {point.name}"
    return f"plugin {point.name} ({dist.name} {dist.version})" if dist is not None else f"plugin {point.name}"


def register_plugins(registries: MutableMapping[str, Registry], points: Iterable[EntryPoint]) -> None:
    """Load each entry point (sorted by name, so the order is the same everywhere) into `registries`. A plugin may
    also bring a registry of its own (`registries["asct_credits"] = Registry(...)`, for the names its settings
    section marks `Registered("asct_credits")`); a name already taken is refused."""
    for point in sorted(points, key=lambda p: p.name):
        source = source_of(point)
        before = {key: set(registry.names()) for key, registry in registries.items()}
        try:
            loaded = point.load()
            if not isinstance(loaded, ModuleType):
                loaded(registries)
        except UserError as e:
            raise UserError(f"{source}: {e}") from None
        except Exception as e:
            raise UserError(f"{source} ({point.value}) failed: {type(e).__name__}: {e}") from None
        for key, registry in registries.items():
            for name in set(registry.names()) - before.get(key, set()):
                registry.entry(name).meta.setdefault("source", source)
