"""Field markers of the settings models, and walkers over them: the vocabulary config.py, posttrain.resolve and the
launchers' schemas share.

A field whose value names a registry entry is marked `Registered("<registry>")`; a per-component settings mapping
is marked `OptionsOf("<registry>", ...)`. `config.py` only marks them (it imports no component); `posttrain.resolve`
checks the marked values against the registries, and `posttrain.orchestration.schema` turns the marked keys into
drop-downs of the registered names. This module is a leaf, like config.py.
"""

from __future__ import annotations

import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel


@dataclass(frozen=True)
class Registered:
    """Field metadata: the value (or each item of a tuple) names an entry of registry `registry`; with `meta`,
    only entries whose registry meta holds that key qualify (`why` says what the others lack)."""

    registry: str
    meta: str | None = None
    why: str = ""

    def admits(self, entry_meta: dict[str, Any]) -> bool:
        return self.meta is None or bool(entry_meta.get(self.meta))


@dataclass(frozen=True, init=False)
class OptionsOf:
    """Field metadata: a `{name: {key: value}}` mapping of per-component settings, each name registered in one
    of `registries` with an options model (registry meta `options`)."""

    registries: tuple[str, ...]

    def __init__(self, *registries: str):
        object.__setattr__(self, "registries", registries)


Options = dict[str, Any]  # name -> raw settings as read; name -> the parsed options model once resolved


Marker = Registered | OptionsOf


def marker_of(metadata: typing.Iterable[Any]) -> Marker | None:
    return next((m for m in metadata if isinstance(m, (Registered, OptionsOf))), None)


def item_type(annotation: Any) -> Any:
    """The item type of `tuple[X, ...]`, else None."""
    if typing.get_origin(annotation) is tuple:
        args = typing.get_args(annotation)
        return args[0] if args else None
    return None


def is_section(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def marked_values(model: BaseModel, prefix: str = "") -> Iterator[tuple[str, Marker, Any, BaseModel]]:
    """(dotted key, marker, value, owning section) for every marked field in `model`: nested sections and
    tuples of sections are walked; a tuple of registered names yields one item per name (`key.i`)."""
    for name, field in type(model).model_fields.items():
        value, key = getattr(model, name), f"{prefix}{name}"
        marker = marker_of(field.metadata)
        item = item_type(field.annotation)
        if marker is not None:
            if value is not None:
                yield key, marker, value, model
        elif item is not None and typing.get_origin(item) is Annotated and marker_of(item.__metadata__) is not None:
            for i, v in enumerate(value):
                yield f"{key}.{i}", marker_of(item.__metadata__), v, model
        elif isinstance(value, BaseModel):
            yield from marked_values(value, f"{key}.")
        elif item is not None and is_section(item):
            for i, v in enumerate(value):
                yield from marked_values(v, f"{key}.{i}.")


def registered_keys(model: type[BaseModel], prefix: str = "") -> dict[str, Registered]:
    """`key -> marker` for the class: `rl.advantage`, `rl.aux[]` (each item), `rl.rewards[].name` (a field of each item)."""
    keys: dict[str, Registered] = {}
    for name, field in model.model_fields.items():
        key, marker, item = f"{prefix}{name}", marker_of(field.metadata), item_type(field.annotation)
        if isinstance(marker, Registered):
            keys[key] = marker
        elif item is not None and typing.get_origin(item) is Annotated and isinstance(marker_of(item.__metadata__), Registered):
            keys[f"{key}[]"] = marker_of(item.__metadata__)
        elif is_section(field.annotation):
            keys.update(registered_keys(field.annotation, f"{key}."))
        elif item is not None and is_section(item):
            keys.update(registered_keys(item, f"{key}[]."))
    return keys
