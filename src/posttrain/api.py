"""The CLI's entry points as Python functions: `posttrain.run_stage` and `posttrain.load_settings`.

    import posttrain

    cfg = posttrain.load_settings("params.yaml", ["sft.steps=2"])   # the validated settings (one clear error line)
    metrics = posttrain.run_stage("sft", overrides=["sft.steps=2"])  # what `posttrain sft --set sft.steps=2` runs

`posttrain <stage>` (cli.py) runs exactly `run_stage`: the output lock first, the settings through
`posttrain.resolve.load`, then `posttrain.stages.execute`. A mistake a user can make raises `posttrain.errors.UserError`
(the CLI prints its one line and exits 2).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from posttrain.config import Config


def load_settings(params: str | Path = "params.yaml", overrides: Sequence[str] = (), stage: str | None = None) -> Config:
    """The validated settings of `params` with `overrides` (`section.key=value`) applied; with `stage`, those of the
    sections that stage reads, as it reads them (a recipe's section it does not read is neither checked nor there)."""
    from posttrain import resolve

    return resolve.load(params, tuple(overrides), stage)


def local_inputs(locations: Mapping[str, str | Path]) -> dict[str, Path]:
    """name -> local directory; an `s3://` input is fetched into the input cache first (posttrain.storage)."""
    from posttrain.storage import local_path

    return {name: local_path(str(location)) for name, location in locations.items()}


def run_stage(stage: str, params: str | Path = "params.yaml", overrides: Sequence[str] = (),
              inputs: Mapping[str, str | Path] | None = None, out: str | Path | None = None, resume: bool = False, *,
              launcher: str = "api", lock: bool = True) -> dict[str, float]:
    """Run pipeline stage `stage` into `out` (default outputs/<stage>) and return its metrics.

    `inputs` maps an input's name to a directory or `s3://` prefix (default: outputs/<upstream stage>); `resume`
    continues from the stage's last checkpoint. `lock=False` when the caller already holds the output's lock (the CLI
    takes it before importing anything heavy); torchrun's non-zero ranks never take it (rank 0 alone writes)."""
    from posttrain.locks import OutputLock

    out_dir = Path(out) if out is not None else Path("outputs") / stage
    lock = lock and os.environ.get("RANK", "0") == "0"
    with OutputLock(out_dir) if lock else contextlib.nullcontext():  # a second writer is refused before any work
        from posttrain import stages

        cfg = load_settings(params, overrides, stage)
        return stages.execute(stage, cfg, local_inputs(inputs or {}), out_dir, launcher=launcher, resume=resume, locked=True)
