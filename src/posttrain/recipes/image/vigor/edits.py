"""Curated quadruplets as tensors for the flow model: (S_new, A_old, A_new, instruction) -> S_old.

The curate stage writes `quadruplets.parquet` (one row per quadruplet, with its split and edited region)
and `images.npz` (`images`: uint8 [N, 4, H, W, 3] in the order S_old, S_new, A_old, A_new).
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from posttrain.data.files import read_parquet
from posttrain.recipes.image.vigor.render import slot_mask
from posttrain.errors import UserError
from posttrain.recipes.image.rewards import EditBatch


@dataclass(frozen=True)
class Edits:
    target: Tensor  # [N, 3, H, W] S_old in [-1, 1]
    source: Tensor  # [N, 3, H, W] S_new
    conditions: Tensor  # [N, 9, H, W] S_new, A_old, A_new
    edit_mask: Tensor  # [N, 1, H, W]
    instructions: tuple[str, ...]
    changes: tuple[str, ...]

    def __len__(self) -> int:
        return self.target.shape[0]

    def take(self, index: Tensor | list[int]) -> "Edits":
        index = torch.as_tensor(index, dtype=torch.long)
        pick = [int(i) for i in index]
        return Edits(self.target[index], self.source[index], self.conditions[index], self.edit_mask[index],
                     tuple(self.instructions[i] for i in pick), tuple(self.changes[i] for i in pick))

    def judged(self) -> EditBatch:
        """The rewards' view, in [0, 1]."""
        return EditBatch((self.source + 1) / 2, (self.target + 1) / 2, self.edit_mask, self.instructions)


QUADRUPLET_COLUMNS = ("split", "region", "instruction", "change")  # what the flow stages read from the table


def read_curated(directory: Path) -> tuple[pd.DataFrame, np.ndarray]:
    """curate's table and images, checked against each other: a damaged file, a missing column or images
    that do not match the rows is one `UserError` line naming the file (not a pyarrow / zipfile traceback,
    nor a model trained on misaligned pairs)."""
    table = read_parquet(directory / "quadruplets.parquet", "curated data")
    missing = [c for c in QUADRUPLET_COLUMNS if c not in table.columns]
    if missing:
        expected = ", ".join(QUADRUPLET_COLUMNS)
        raise UserError(f"{directory / 'quadruplets.parquet'}: lacks column(s) {', '.join(missing)}; expected {expected}")
    npz = directory / "images.npz"
    try:
        with np.load(npz) as archive:
            images = archive["images"]
    except (OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile) as e:  # what np.load raises for a damaged archive
        raise UserError(f"cannot read {npz}: {e}") from None
    if images.ndim != 5 or images.shape[0] != len(table) or images.shape[1] != 4 or images.shape[-1] != 3:
        raise UserError(f"{npz}: images of shape {list(images.shape)} do not match the table's {len(table)} quadruplets "
                        "(expected [rows, 4, H, W, 3])")
    return table, images


def load_edits(directory: Path, split: str, size: int) -> Edits:
    """The `split` quadruplets at `size` px (area-averaged down from the curated resolution when smaller)."""
    directory = Path(directory)
    table, images = read_curated(directory)
    rows = np.flatnonzero(table["split"].to_numpy() == split)
    if rows.size == 0:
        raise UserError(f"{directory}: no quadruplets in split {split!r} (curate more panoramas or change curate.heldout_fraction)")
    pixels = torch.from_numpy(images[rows]).float().div(127.5).sub(1.0).permute(0, 1, 4, 2, 3)  # [N, 4, 3, H, W]
    if size > pixels.shape[-1]:
        raise UserError(f"flow.image_size {size} is larger than the curated images ({pixels.shape[-1]} px)")
    if size < pixels.shape[-1]:
        flat = torch.nn.functional.interpolate(pixels.flatten(0, 1), size=(size, size), mode="area")
        pixels = flat.view(len(rows), 4, 3, size, size)
    masks = np.stack([slot_mask(size, region) for region in table["region"].to_numpy()[rows]])
    return Edits(
        target=pixels[:, 0].contiguous(), source=pixels[:, 1].contiguous(),
        conditions=pixels[:, 1:].reshape(len(rows), 9, size, size).contiguous(),
        edit_mask=torch.from_numpy(masks).float()[:, None],
        instructions=tuple(table["instruction"].to_numpy()[rows]), changes=tuple(table["change"].to_numpy()[rows]),
    )
