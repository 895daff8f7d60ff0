"""Trained reward models, read from the output directory of the stage that trained them (`<dir>/model/`).

One cache for every kind: a reward is called once per RL step, and loading the weights each time would dominate the
step; an entry is keyed by the resolved path and the weights' modification time, so a retrained model is re-read.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from posttrain.errors import UserError
from posttrain.storage import MODEL, model_dir

T = TypeVar("T")


@functools.lru_cache(maxsize=4)
def _cached(build: Callable[[str], T], path: str, stamp: float) -> T:
    return build(path)


def load_trained(directory: str, build: Callable[[str], T], *, needs: Sequence[str] = (), plain: bool = False, missing: str) -> T:
    """`build(path)` for the model saved under `directory/model` (cached while its config.json is unchanged). A UserError
    `missing` (its `{path}` filled in) when config.json or one of the files `needs` is absent. With `plain`, `directory`
    may also be a plain `save_pretrained` checkpoint (config.json at its top): `build` gets it, without the files `needs`."""
    path = model_dir(Path(directory)) if plain else Path(directory) / MODEL
    if path == Path(directory):  # a plain checkpoint: what `build` reads from a stage output's extra files it defaults
        needs = ()
    if not all((path / name).is_file() for name in ("config.json", *needs)):
        raise UserError(missing.format(path=path))
    return _cached(build, str(path.resolve()), (path / "config.json").stat().st_mtime)
