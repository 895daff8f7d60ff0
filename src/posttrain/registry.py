"""Name -> implementation registries.

Every interchangeable part (advantage estimators, policy losses, rewards, tasks, stages) is registered
under a name; `params.yaml` selects parts by these names and nothing else dispatches on them. The list of
every registry, and the full check of a config against them (with the meta rules), live in `posttrain.resolve`;
the functions below check one section against the registries they are given, so a trainer that derives a
section (the distill stage's rl settings) resolves it with the registries it already imports.

A registry made with an `importer` also takes a `module:attr` name (`my_pkg.rewards:score`): the first check of
such a name imports the attribute, adapts it with `importer(obj, name)` and registers the result under that
name, so every later lookup is an ordinary one.
"""

from __future__ import annotations

import difflib
import importlib
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from posttrain import config
from posttrain import markers
from posttrain.markers import OptionsOf, Registered
from posttrain.errors import UserError

T = TypeVar("T")

IMPORT_PATH = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")  # `package.module:attr` (attr may be dotted)


@dataclass(frozen=True)
class Entry(Generic[T]):
    name: str
    obj: T
    meta: dict[str, Any] = field(default_factory=dict)


class UnknownName(UserError):
    pass


class Registry(Generic[T]):
    """A named collection of implementations of one kind (e.g. "advantage estimator")."""

    def __init__(self, kind: str, importer: Callable[[Any, str], T] | None = None):
        self.kind = kind
        self.importer = importer  # set: `module:attr` names are imported (`import_path`)
        self._entries: dict[str, Entry[T]] = {}

    def register(self, name: str, **meta: Any) -> Callable[[T], T]:
        def add(obj: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._entries[name] = Entry(name, obj, dict(meta))
            return obj

        return add

    def entry(self, name: str) -> Entry[T]:
        try:
            return self._entries[name]
        except KeyError:
            raise UnknownName(self.unknown_message(name)) from None

    def get(self, name: str) -> T:
        return self.entry(name).obj

    def import_path(self, path: str) -> Entry[T]:
        """Import `module:attr`, adapt it with the importer and register it as `path` (meta `source`: the path).
        The module is looked up on sys.path, the working directory included. A missing module or attribute, or
        one that is not callable, is a UserError."""
        if path in self._entries:
            return self._entries[path]
        if self.importer is None or not IMPORT_PATH.fullmatch(path):
            raise UnknownName(self.unknown_message(path))
        module_name, _, attr = path.partition(":")
        if os.getcwd() not in sys.path:  # as `python -m` does: a module next to params.yaml is importable
            sys.path.append(os.getcwd())
        try:
            obj: Any = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            raise UserError(f"{self.kind} {path!r}: no module named {e.name!r}") from None
        except Exception as e:  # the module itself fails: its own error, in one line
            raise UserError(f"{self.kind} {path!r}: importing {module_name} failed: {type(e).__name__}: {e}") from None
        for part in attr.split("."):
            if not hasattr(obj, part):
                raise UserError(f"{self.kind} {path!r}: {module_name} has no attribute {attr!r}")
            obj = getattr(obj, part)
        if not callable(obj):
            raise UserError(f"{self.kind} {path!r}: {attr} is not a function (got {type(obj).__name__})")
        self.register(path, source=path)(self.importer(obj, path))
        return self._entries[path]

    def unknown_message(self, name: str) -> str:
        close = difflib.get_close_matches(name, self.names(), n=3, cutoff=0.5)
        hint = f"did you mean {', '.join(repr(c) for c in close)}?" if close else f"choose from {', '.join(self.names())}"
        own = " (or your own function as module:attr)" if self.importer is not None else ""
        return f"unknown {self.kind} {name!r}; {hint}{own}"

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[Entry[T]]:
        return iter(self._entries[n] for n in self.names())


# --- config sections checked against registries (the markers of config.py) -----------------------------------

def resolve_section(model: BaseModel, key: str, registries: Mapping[str, Registry]) -> BaseModel:
    """A config section (or a whole config, key "") checked against `registries`: every marked name registered,
    every options block validated and parsed (`section.options_for(name)` then returns the parsed model)."""
    prefix = f"{key}." if key else ""
    check_names(model, registries, prefix)
    return parse_options(model, prefix, registries)


def update_section(model: BaseModel, key: str, registries: Mapping[str, Registry], **update: Any) -> BaseModel:
    """`model` with `update` applied and resolved again. An `options` update is merged block by block over the
    current settings: `update_section(cfg.rl, "rl", regs, options={"qglas": {"gamma_max": 0.5}})`."""
    if "options" in update:
        merged = {name: _raw(block) for name, block in model.options.items()}
        for name, block in update["options"].items():
            merged[name] = {**merged.get(name, {}), **_raw(block)}
        update["options"] = merged
    return resolve_section(model.model_copy(update=update), key, registries)


def _raw(block: Any) -> dict[str, Any]:
    return block.model_dump() if isinstance(block, BaseModel) else dict(block or {})


# --- names ------------------------------------------------------------------------------------------------

def admitted(registry: Registry, marker: Registered) -> list[str]:
    """The names a `Registered` field may take: every entry, or those whose meta holds `marker.meta`."""
    return [e.name for e in registry if marker.admits(e.meta)]


def check_names(model: BaseModel, registries: Mapping[str, Registry], prefix: str = "") -> None:
    for key, marker, value, _ in markers.marked_values(model, prefix):
        if not isinstance(marker, Registered):
            continue
        registry = registries[marker.registry]
        if value not in registry and registry.importer is not None and IMPORT_PATH.fullmatch(str(value)):
            try:
                registry.import_path(str(value))
            except UserError as e:
                raise UserError(f"{key}: {e}") from None
        if value not in registry:
            raise UserError(f"{key}: {registry.unknown_message(str(value))}")
        if not marker.admits(registry.entry(value).meta):
            raise UserError(f"{key}: {value!r} {marker.why}; choose from {', '.join(admitted(registry, marker))}")


# --- options ----------------------------------------------------------------------------------------------

_KIND_WORD = {
    "advantages": "estimator", "losses": "loss", "rewards": "reward", "auxiliaries": "auxiliary term", "tasks": "task",
    "reward_models": "reward model", "preference_objectives": "preference objective", "edit_methods": "edit method", "samplers": "sampler",
    "corrections": "off-policy correction", "pool_policies": "pool policy",
}


def option_schema(name: str, kinds: tuple[str, ...], registries: Mapping[str, Registry]) -> type[BaseModel] | None:
    """The options model declared by the component registered as `name` in one of `kinds`, if any."""
    for kind in kinds:
        if name in registries[kind]:
            return registries[kind].entry(name).meta.get("options")
    return None


def parse_options(model: BaseModel, prefix: str, registries: Mapping[str, Registry]) -> BaseModel:
    """`model` with every `OptionsOf` mapping (its own and its sections') parsed into options models."""
    update: dict[str, Any] = {}
    for name, info in type(model).model_fields.items():
        value = getattr(model, name)
        marker = markers.marker_of(info.metadata)
        if isinstance(marker, OptionsOf):
            defaults = info.get_default(call_default_factory=True) or {}  # a section's own defaults for some components (eval's power)
            merged = {**defaults, **{k: {**_raw(defaults.get(k)), **_raw(v)} for k, v in value.items()}}
            update[name] = _parsed_block(model, merged, marker.registries, f"{prefix}{name}", registries)
        elif isinstance(value, BaseModel):
            parsed = parse_options(value, f"{prefix}{name}.", registries)
            if parsed is not value:
                update[name] = parsed
    return model.model_copy(update=update) if update else model


def _parsed_block(owner: BaseModel, options: dict[str, Any], kinds: tuple[str, ...], where: str, registries) -> dict[str, Any]:
    parsed: dict[str, Any] = {}
    for name, values in options.items():
        schema = option_schema(name, kinds, registries)
        if schema is None:
            words = [_KIND_WORD[k] for k in kinds]
            kind = ", ".join(words[:-1]) + (" or " if len(words) > 1 else "") + words[-1]
            raise UserError(f"{where}.{name}: no registered {kind} named {name!r} takes options")
        values = _raw(values)  # a block may already be parsed (a section resolved twice)
        try:
            parsed[name] = schema.model_validate(values)
        except ValidationError as e:
            raise UserError(config.one_line(e, schema, prefix=f"{where}.{name}.")) from None
    # every other component of these kinds runs on its options model's defaults (the settings hold them all, so a
    # derived section or a test reads any component's settings); one in use whose model has no defaults needs a block
    used = {v for _, m, v, o in markers.marked_values(owner) if isinstance(m, Registered) and m.registry in kinds}
    for kind in kinds:
        for entry in registries[kind]:
            schema = entry.meta.get("options")
            if schema is None or entry.name in parsed:
                continue
            try:
                parsed[entry.name] = schema()
            except ValidationError as e:
                if entry.name in used:
                    raise UserError(f"{where}.{entry.name}: needs settings ({config.one_line(e, schema, prefix=f'{where}.{entry.name}.')})") from None
    return dict(sorted(parsed.items()))
