"""Training checkpoints: model weights, the trainer's state (optimizer, schedule, data position, ...) and every RNG
state, so a resumed run continues bit-for-bit where it stopped.

A checkpoint is written to a hidden temporary directory, every file and the directory are fsynced, and only then
is it renamed to `step-NNNNNN` (and the parent fsynced): a crash or power loss leaves either the whole checkpoint
or none. `manifest.json` holds the sha256 of every file, checked before a checkpoint is loaded. The newest `keep` are
kept; when the newest cannot be read (a torn disk, a truncated file, a flipped bit) `load_latest` falls back to the one
before it.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import random
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, load_model, save_file, save_model

from posttrain.errors import UserError
from posttrain.runtime import fault_point

MANIFEST = "manifest.json"  # {"sha256": {file name: hex digest}} of the checkpoint's other files


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


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(directory: Path, step: int, model: torch.nn.Module, trainer_state: dict[str, Any], keep: int = 2,
                    weights: dict[str, torch.Tensor] | None = None) -> Path:
    """Write `directory/step-NNNNNN` durably and atomically and keep only the newest `keep` checkpoints. `weights`:
    the model's whole state dict when it was gathered already (an FSDP-sharded model, training.sharding)."""
    final = directory / f"step-{step:06d}"
    tmp = directory / f".step-{step:06d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if weights is None:
        save_model(model, str(tmp / "model.safetensors"))
    else:
        save_file({k: v.contiguous() for k, v in weights.items()}, str(tmp / "model.safetensors"))
    torch.save({**trainer_state, "step": step, "rng": _rng_state()}, tmp / "trainer.pt")
    files = ("model.safetensors", "trainer.pt")
    (tmp / MANIFEST).write_text(json.dumps({"sha256": {name: _sha256(tmp / name) for name in files}}, indent=1) + "\n")
    fault_point("checkpoint:written")
    for written in (*(tmp / name for name in (*files, MANIFEST)), tmp):
        _fsync(written)
    fault_point("checkpoint:fsynced")
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    fault_point("checkpoint:renamed")
    _fsync(directory)
    for old in checkpoints(directory)[:-keep]:
        shutil.rmtree(old)
    return final


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_checksums(path: Path) -> None:
    """Every file the checkpoint's manifest lists has its recorded sha256 (raises `Unreadable`). A checkpoint
    written before manifests existed has none and is read as it is."""
    manifest = path / MANIFEST
    if not manifest.is_file():
        return
    try:
        recorded = json.loads(manifest.read_text())["sha256"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise Unreadable(f"{path.name}: {MANIFEST} cannot be read ({_first_line(e)})") from None
    for name, digest in recorded.items():
        try:
            found = _sha256(path / name)
        except OSError as e:
            raise Unreadable(f"{path.name}: {_first_line(e)}") from None
        if found != digest:
            raise Unreadable(f"{path.name}: {name} does not match its checksum (sha256 {found[:12]}..., recorded {digest[:12]}...)")


def checkpoints(directory: Path) -> list[Path]:
    """The complete checkpoints in `directory`, oldest first."""
    return sorted(p for p in directory.glob("step-*") if p.is_dir())


def latest_checkpoint(directory: Path) -> Path | None:
    found = checkpoints(directory)
    return found[-1] if found else None


def load_checkpoint(path: Path, model: torch.nn.Module, config_hash: str) -> dict[str, Any]:
    """Restore weights and RNG state from `path`; return the trainer state (optimizer, schedule, ...).
    A checkpoint made under other settings is refused (UserError); one that cannot be read raises `Unreadable`."""
    verify_checksums(path)  # before anything is loaded: a flipped bit is no checkpoint, however well it parses
    try:
        state = torch.load(path / "trainer.pt", weights_only=True)
        if state.get("config_hash") != config_hash:
            raise UserError(f"checkpoint {path} was made with other settings; delete {path.parent.parent} or run without --resume")
        from posttrain.trainers import distributed

        if distributed.is_sharded(model):  # every rank reads the whole file and keeps its shards
            distributed.load_full_state_dict(model, load_file(str(path / "model.safetensors")))
        else:
            load_model(model, str(path / "model.safetensors"))  # reads the whole file before it copies a tensor
    except (OSError, EOFError, SafetensorError, pickle.UnpicklingError, RuntimeError) as e:  # truncated, torn or missing
        raise Unreadable(f"{path.name}: {_first_line(e)}") from None
    _set_rng_state(state["rng"])
    return state


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


class Unreadable(Exception):
    """A checkpoint whose files cannot be read back."""


def load_latest(directory: Path, model: torch.nn.Module, config_hash: str) -> tuple[Path, dict[str, Any]] | None:
    """Restore the newest readable checkpoint in `directory` (see `load_checkpoint`); falls back to older ones,
    saying so on stderr, and raises a UserError when there are checkpoints but none can be read."""
    found = checkpoints(directory)
    problems = []
    for path in reversed(found):
        try:
            state = load_checkpoint(path, model, config_hash)
        except Unreadable as e:
            problems.append(str(e))
            print(f"posttrain: checkpoint {path} cannot be read ({e}); trying an older one", file=sys.stderr)
            continue
        return path, state
    if found:
        raise UserError(f"no checkpoint in {directory} can be read ({'; '.join(problems)}); delete it or run without --resume")
    return None
