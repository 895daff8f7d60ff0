"""The import rules of docs/ARCHITECTURE.md, checked by reading the source (nothing is imported).

Every `import` / `from ... import` of `posttrain.*` counts, those inside functions included (a lazy import is
still a dependency, and it is how a cycle hides); only imports under `if TYPE_CHECKING:` are left out, since
they never run.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "posttrain"

# lowest first; a module belongs to the longest prefix listed
LAYERS: tuple[tuple[str, ...], ...] = (
    ("posttrain.config", "posttrain.markers", "posttrain.settings_help", "posttrain.errors", "posttrain.signals", "posttrain.state", "posttrain.uris",
     "posttrain"),
    ("posttrain.models", "posttrain.registry", "posttrain.tracking", "posttrain.media", "posttrain.storage", "posttrain.runtime", "posttrain.locks"),
    ("posttrain.rollout", "posttrain.objectives", "posttrain.rewards", "posttrain.tasks", "posttrain.envs",
     "posttrain.data", "posttrain.eval"),
    ("posttrain.trainers",),
    ("posttrain.stages",),
    ("posttrain.recipes",),
    ("posttrain.cli", "posttrain.api", "posttrain.orchestration", "posttrain.resolve", "posttrain.plugins"),
)
LAYER_NAMES = ("leaves", "models/registry/tracking/media/storage/runtime/locks", "parts", "trainers", "stages", "recipes",
               "launchers and the config boundary")
LEAVES = LAYERS[0]
# posttrain/__init__.py's `__getattr__` hands out posttrain.run_stage / load_settings (api.py) on first use: the one
# import a leaf may make upward. The cycle checks still count it, so nothing below may import the package to reach it.
FRONT_DOOR = ("posttrain", "posttrain.api")
OBJECTIVES_MAY_IMPORT = ("posttrain.objectives", "posttrain.rollout", "posttrain.registry", "posttrain.config",
                         "posttrain.errors", "posttrain.state")


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    file: str  # its path, relative to src/
    line: int
    target: str  # the posttrain module imported

    def __str__(self) -> str:
        return f"{self.file}:{self.line} imports {self.target}"


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


class _ImportCollector(ast.NodeVisitor):
    def __init__(self, module: str, is_package: bool, known_modules: frozenset[str]):
        self.package = module if is_package else module.rpartition(".")[0]
        self.known_modules = known_modules
        self.found: list[tuple[int, str]] = []

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):
            for child in node.orelse:  # the else branch does run
                self.visit(child)
            return
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        self.found += [(node.lineno, alias.name) for alias in node.names]

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            parts = self.package.split(".")
            base = ".".join(parts[: len(parts) - (node.level - 1)])
            source = f"{base}.{node.module}" if node.module else base
        else:
            source = node.module or ""
        for alias in node.names:
            # `from posttrain import stages` imports the module posttrain.stages, not the package
            submodule = f"{source}.{alias.name}"
            target = submodule if submodule in self.known_modules else source
            if (node.lineno, target) not in self.found:  # `from m import a, b` is one import of m
                self.found.append((node.lineno, target))


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_in(source: str, module: str, *, is_package: bool = False,
               known_modules: frozenset[str] = frozenset()) -> list[tuple[int, str]]:
    """(line, imported module) for every import of posttrain in `source`, the module named `module`."""
    collector = _ImportCollector(module, is_package, known_modules)
    collector.visit(ast.parse(source))
    return [(line, target) for line, target in collector.found
            if target == "posttrain" or target.startswith("posttrain.")]


def all_imports() -> list[Import]:
    files = sorted(PACKAGE.rglob("*.py"))
    known = frozenset(module_name(f) for f in files)
    found = []
    for f in files:
        module = module_name(f)
        for line, target in imports_in(f.read_text(), module, is_package=f.name == "__init__.py", known_modules=known):
            found.append(Import(module, str(f.relative_to(SRC)), line, target))
    return found


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def layer_of(module: str) -> int | None:
    best = None
    for level, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if _within(module, prefix) and (best is None or len(prefix) > len(best[1])):
                best = (level, prefix)
    # the package itself is a leaf; its submodules are not leaves by default
    if best is not None and best[1] == "posttrain" and module != "posttrain":
        return None
    return None if best is None else best[0]


def top_package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _report(title: str, violations: list[str]) -> str:
    return f"{title} ({len(violations)}):\n  " + "\n  ".join(violations)


def test_the_parser_sees_lazy_relative_and_submodule_imports_and_skips_type_checking():
    source = '''
from typing import TYPE_CHECKING
import torch
from posttrain.errors import UserError
if TYPE_CHECKING:
    from posttrain.trainers import Trainer
else:
    import posttrain.models.factory

def load():
    from posttrain.rollout.sampling import generate
    class Inner:
        def method(self):
            import posttrain.tracking as tracking
    return generate

from . import arithmetic
from ..data import files
from posttrain import stages, __version__
'''
    found = imports_in(source, "posttrain.tasks.base",
                       known_modules=frozenset({"posttrain.stages", "posttrain.tasks.arithmetic", "posttrain.data.files"}))
    assert found == [
        (4, "posttrain.errors"),
        (8, "posttrain.models.factory"),
        (11, "posttrain.rollout.sampling"),
        (14, "posttrain.tracking"),
        (17, "posttrain.tasks.arithmetic"),
        (18, "posttrain.data.files"),
        (19, "posttrain.stages"),
        (19, "posttrain"),
    ]
    # in a package's __init__, `.` is the package itself
    assert imports_in("from .base import Task", "posttrain.tasks", is_package=True) == [(1, "posttrain.tasks.base")]


def test_every_module_has_a_layer():
    files = sorted(PACKAGE.rglob("*.py"))
    unplaced = [str(f.relative_to(SRC)) for f in files if layer_of(module_name(f)) is None]
    assert not unplaced, _report("modules in no layer: add them to LAYERS", unplaced)


def test_no_module_imports_a_higher_layer():
    violations = []
    for imp in all_imports():
        mine, theirs = layer_of(imp.module), layer_of(imp.target)
        if mine is not None and theirs is not None and theirs > mine and (imp.module, imp.target) != FRONT_DOOR:
            violations.append(f"{imp} (layer {theirs} {LAYER_NAMES[theirs]} > layer {mine} {LAYER_NAMES[mine]})")
    assert not violations, _report("imports of a higher layer", violations)


def recipe_of(module: str) -> str | None:
    """`posttrain.recipes.dsp.trainer` -> `posttrain.recipes.dsp`; None outside a recipe."""
    parts = module.split(".")
    return ".".join(parts[:3]) if parts[:2] == ["posttrain", "recipes"] and len(parts) > 2 else None


def test_nothing_outside_a_recipe_imports_it():
    """The core (launchers included) imports no recipe, and no recipe imports another: a recipe reaches the CLI,
    the launchers and the registries only as a plugin entry point (pyproject.toml)."""
    violations = [str(imp) for imp in all_imports()
                  if recipe_of(imp.target) is not None and recipe_of(imp.target) != recipe_of(imp.module)]
    assert not violations, _report("imports of a recipe from outside it", violations)
    assert recipe_of("posttrain.recipes.dsp.trainer") == "posttrain.recipes.dsp" and recipe_of("posttrain.stages.rl") is None


def test_objectives_import_only_tensors_and_leaf_types():
    violations = [str(imp) for imp in all_imports() if _within(imp.module, "posttrain.objectives")
                  and not any(_within(imp.target, allowed) for allowed in OBJECTIVES_MAY_IMPORT)]
    assert not violations, _report(f"objectives may import only {', '.join(OBJECTIVES_MAY_IMPORT)}", violations)


def test_nothing_imports_the_cli():
    violations = [str(imp) for imp in all_imports()
                  if _within(imp.target, "posttrain.cli") and not _within(imp.module, "posttrain.cli")]
    assert not violations, _report("imports of posttrain.cli", violations)


def test_config_imports_only_leaves():
    violations = [str(imp) for imp in all_imports() if _within(imp.module, "posttrain.config")
                  and not any(imp.target == leaf or (leaf != "posttrain" and _within(imp.target, leaf))
                              for leaf in LEAVES)]
    assert not violations, _report(f"posttrain.config may import only {', '.join(LEAVES)}", violations)


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def _shortest_cycle_through(start: str, graph: dict[str, set[str]], members: set[str]) -> list[str]:
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt_frontier = []
        for node in frontier:
            for nxt in sorted(graph.get(node, ())):
                if nxt not in members:
                    continue
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return path[::-1]
                if nxt not in previous:
                    previous[nxt] = node
                    nxt_frontier.append(nxt)
        frontier = nxt_frontier
    raise AssertionError(f"{start} is in a strongly connected component but on no cycle")


def _upward(imp: Import) -> str:
    mine, theirs = layer_of(imp.module), layer_of(imp.target)
    return "  (up a layer)" if mine is not None and theirs is not None and theirs > mine else ""


def _cycles(imports: list[Import], node_of) -> list[str]:
    """Each cycle among the nodes `node_of` maps modules to, as `a -> b -> a` with one import per edge."""
    graph: dict[str, set[str]] = defaultdict(set)
    witness: dict[tuple[str, str], Import] = {}
    for imp in imports:
        a, b = node_of(imp.module), node_of(imp.target)
        if a != b:
            graph[a].add(b)
            witness.setdefault((a, b), imp)
    cycles: dict[tuple[str, ...], str] = {}
    for component in _strongly_connected(graph):
        if len(component) < 2:
            continue
        for start in component:
            cycle = _shortest_cycle_through(start, graph, set(component))
            pivot = cycle.index(min(cycle))
            key = tuple(cycle[pivot:] + cycle[:pivot])
            if key in cycles:
                continue
            edges = [(key[i], key[(i + 1) % len(key)]) for i in range(len(key))]
            cycles[key] = " -> ".join(key + key[:1]) + "".join(
                f"\n      {a} -> {b}: {witness[a, b]}{_upward(witness[a, b])}" for a, b in edges)
    return list(cycles.values())


def package_cycles(imports: list[Import]) -> list[str]:
    """Each cycle among the top-level packages, as `a -> b -> a` with one import per edge."""
    return _cycles(imports, top_package)


def _registration(imp: Import, hubs: tuple[str, ...], direct: set[tuple[str, str]]) -> bool:
    """Whether `imp` is a hub importing a module that registers into it: a hub package importing one of its own
    submodules, or a hub module importing a module that imports the hub."""
    if imp.module not in hubs:
        return False
    is_package = (PACKAGE.joinpath(*imp.module.split(".")[1:]) / "__init__.py").exists()
    return (is_package and imp.target.startswith(imp.module + ".")) or (imp.target, imp.module) in direct


def module_cycles(imports: list[Import], hubs: tuple[str, ...] = ()) -> list[str]:
    """Each cycle among the modules, as `a -> b -> a` with one import per edge, leaving out only the registration
    imports of `hubs` (KNOWN_CYCLE_HUBS: a registry that imports the modules that register into it): any other
    import of a hub still counts, so a loop through a hub by another way is still reported."""
    direct = {(imp.module, imp.target) for imp in imports}
    return _cycles([imp for imp in imports if not _registration(imp, hubs, direct)], lambda m: m)


# Registries whose module imports, at its end (or lazily), the modules that register into it, while those import the
# registry back: `import posttrain.objectives` then registers every part. Only those registration imports are left
# out of the module cycle check (a test below checks that each hub still closes a cycle: delete it here once not).
# Breaking them means moving each registry into a small module of its own (e.g. objectives/registries.py) that the
# package's __init__ and its parts both import: left to the recipes move, which relocates most of those parts.
KNOWN_CYCLE_HUBS = (
    "posttrain.objectives",  # objectives/__init__ imports every estimator/loss module; they import its registries
    "posttrain.objectives.off_policy",  # the corrections registry; icepop, m2po, opsm, rejection, sampler_is register
    "posttrain.objectives.preference",  # the preference losses registry; abc_align, gm_dpo register
    "posttrain.recipes.editing.objective",  # glime registers into editing's registry
    "posttrain.rewards",
    "posttrain.tasks",
    "posttrain.stages",
    "posttrain.recipes.image.flow",  # flow_backends; recipes/image/flux.py registers the `flux` kind
    "posttrain.rollout.samplers",  # rollout/beam.py registers the `beam` sampler
)


def test_cycle_report_names_each_edge():
    imports = [Import("posttrain.tasks.x", "posttrain/tasks/x.py", 3, "posttrain.envs.y"),
               Import("posttrain.envs.y", "posttrain/envs/y.py", 7, "posttrain.tasks"),
               Import("posttrain.envs.y", "posttrain/envs/y.py", 8, "posttrain.errors")]
    assert package_cycles(imports) == [
        "envs -> tasks -> envs"
        "\n      envs -> tasks: posttrain/envs/y.py:7 imports posttrain.tasks"
        "\n      tasks -> envs: posttrain/tasks/x.py:3 imports posttrain.envs.y"]


def test_packages_form_no_cycle():
    cycles = package_cycles(all_imports())
    assert not cycles, _report("cycles among the top-level packages", cycles)


def test_module_cycle_report_names_each_edge():
    imports = [Import("posttrain.trainers.a", "posttrain/trainers/a.py", 3, "posttrain.trainers.b"),
               Import("posttrain.trainers.b", "posttrain/trainers/b.py", 9, "posttrain.trainers.a"),
               Import("posttrain.trainers.b", "posttrain/trainers/b.py", 10, "posttrain.errors")]
    assert module_cycles(imports) == [
        "posttrain.trainers.a -> posttrain.trainers.b -> posttrain.trainers.a"
        "\n      posttrain.trainers.a -> posttrain.trainers.b: posttrain/trainers/a.py:3 imports posttrain.trainers.b"
        "\n      posttrain.trainers.b -> posttrain.trainers.a: posttrain/trainers/b.py:9 imports posttrain.trainers.a"]
    assert module_cycles(imports, hubs=("posttrain.trainers.a",)) == []  # b imports a: a's import of b registers b
    # a hub's other imports still count: a -> b -> c -> a is a cycle although a is a hub
    chain = [Import("posttrain.trainers.a", "posttrain/trainers/a.py", 3, "posttrain.trainers.b"),
             Import("posttrain.trainers.b", "posttrain/trainers/b.py", 9, "posttrain.trainers.c"),
             Import("posttrain.trainers.c", "posttrain/trainers/c.py", 2, "posttrain.trainers.a")]
    assert len(module_cycles(chain, hubs=("posttrain.trainers.a",))) == 1


def test_modules_form_no_cycle():
    """Every import counts, lazy ones too (the module docstring says why), but the registration imports of
    KNOWN_CYCLE_HUBS: every other loop among the modules fails, with its edges."""
    cycles = module_cycles(all_imports(), KNOWN_CYCLE_HUBS)
    assert not cycles, _report("cycles among the modules", cycles)


def test_each_known_cycle_hub_still_closes_a_cycle():
    imports = all_imports()
    for hub in KNOWN_CYCLE_HUBS:
        others = tuple(h for h in KNOWN_CYCLE_HUBS if h != hub)
        assert module_cycles(imports, others), f"{hub} closes no cycle now: remove it from KNOWN_CYCLE_HUBS"
