"""Training checkpoints: model weights, optimizer, scheduler, data position and every RNG state, so a
resumed run continues bit-for-bit where it stopped."""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_model, save_model

from posttrain.errors import UserError


def _rng_state() -> dict[str, Any]:
    np_state = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": [np_state[0], torch.from_numpy(np_state[1].copy()), *np_state[2:]],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy(), *rest))
    torch.set_rng_state(state["torch"])
    if state["cuda"]:
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(directory: Path, step: int, model: torch.nn.Module, trainer_state: dict[str, Any], keep: int = 2) -> Path:
    """Write `directory/step-NNNNNN` atomically and keep only the newest `keep` checkpoints."""
    final = directory / f"step-{step:06d}"
    tmp = directory / f".step-{step:06d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_model(model, str(tmp / "model.safetensors"))
    torch.save({**trainer_state, "step": step, "rng": _rng_state()}, tmp / "trainer.pt")
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    for old in sorted(directory.glob("step-*"))[:-keep]:
        shutil.rmtree(old)
    return final


def latest_checkpoint(directory: Path) -> Path | None:
    found = sorted(directory.glob("step-*"))
    return found[-1] if found else None


def load_checkpoint(path: Path, model: torch.nn.Module, config_hash: str) -> dict[str, Any]:
    """Restore weights and RNG state from `path`; return the trainer state (optimizer, schedule, ...)."""
    state = torch.load(path / "trainer.pt", weights_only=True)
    if state.get("config_hash") != config_hash:
        raise UserError(f"checkpoint {path} was made with other settings; delete {path.parent.parent} or run without --resume")
    load_model(model, str(path / "model.safetensors"))
    _set_rng_state(state["rng"])
    return state
