"""What every training loop shares, so each gives the same two guarantees.

1. **Divergence is caught.** `TrainLoop.optimizer_step` clips the gradients and steps the optimiser only when the
   loss and the gradient norm are finite; a non-finite step is skipped (no update, the optimiser's moments are
   untouched) and counted (`nonfinite_steps`). After more than `training.max_nonfinite_steps` consecutive skipped
   steps the stage fails with one line naming the step and the last checkpoint, which is kept for `--resume`.
   (A diverging run never writes NaN weights: the update that would have made them is the one skipped.)
2. **A killed run resumes bit-for-bit.** Every `every` steps `checkpoint` saves the weights, the loop's *parts*
   (anything with `state_dict` / `load_state_dict`: optimiser, schedule, a trainer object; or a `torch.Generator`),
   the loop's own *values* (history, running metrics) and every RNG (trainers/checkpoint.py). `restore` puts all
   of them back from the newest readable checkpoint and returns the step to continue after.

A stage of several phases (a warm-up, then RL) gives each its own loop (`phase`): the first checkpoints into the
stage's directory, a later one into a subfolder. The first checkpoints its last step too (`save_last`): a resume
after it restores its end state (weights, RNG) and runs none of its steps again, so what follows it (metrics
measured between phases, a reference copied from its result) is recomputed from exactly what an uninterrupted run
had; and a later phase that fails leaves a checkpoint where `stages.execute` looks before keeping the staging
directory (checkpoints/step-*).

A loop that is not run by a stage (a unit test, an experiment) uses `TrainLoop()`: the guard, no checkpoints.
"""

from __future__ import annotations

import math
import random
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from posttrain.errors import UserError
from posttrain.trainers import distributed
from posttrain.trainers.checkpoint import load_latest, save_checkpoint


class NumpyDraws:
    """A numpy Generator as a checkpoint part (TrainLoop saves what has state_dict / load_state_dict)."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng

    def state_dict(self) -> dict:
        return self.rng.bit_generator.state

    def load_state_dict(self, state: dict) -> None:
        self.rng.bit_generator.state = state


def _state_of(part: Any, model: torch.nn.Module | None = None) -> Any:
    if isinstance(part, torch.optim.Optimizer) and model is not None and distributed.is_sharded(model):
        return distributed.full_optimizer_state(model, part)  # a collective: gathered whole, keyed by name
    if isinstance(part, torch.Generator):
        return part.get_state()
    return part.getstate() if isinstance(part, random.Random) else part.state_dict()


def _restore(part: Any, state: Any, model: torch.nn.Module | None = None) -> None:
    if isinstance(part, torch.optim.Optimizer) and model is not None and distributed.is_sharded(model):
        distributed.load_full_optimizer_state(model, part, state)
    elif isinstance(part, torch.Generator):
        part.set_state(state)
    elif isinstance(part, random.Random):
        part.setstate(state)
    else:
        part.load_state_dict(state)


@dataclass
class TrainLoop:
    checkpoint_dir: Path | None = None  # None: never checkpoint (and nothing to resume)
    config_hash: str = ""  # a resume under other settings is refused
    every: int = 0  # steps between checkpoints; 0: none
    resume: bool = False
    max_nonfinite_steps: int = 3  # consecutive skipped steps tolerated (training.max_nonfinite_steps)
    keep: int = 2  # checkpoints kept: the newest, and the one to fall back to when it is unreadable
    section: str = ""  # the settings section whose `checkpoint_every` is `every`, for the error line
    save_last: bool = False  # checkpoint the last step too (a phase that later phases build on)
    nonfinite_steps: int = field(default=0, init=False)  # every skipped step of the run
    consecutive: int = field(default=0, init=False)
    last_checkpoint: Path | None = field(default=None, init=False)

    @classmethod
    def for_stage(cls, training, out_dir: Path, config_hash: str, every: int, resume: bool, section: str, name: str = "") -> "TrainLoop":
        """The loop of a stage writing into `out_dir` (its staging directory): checkpoints in out_dir/checkpoints
        (/<name> for a stage with several loops), the guard and the kept count from the `training` section."""
        directory = out_dir / "checkpoints" / name if name else out_dir / "checkpoints"
        return cls(directory, config_hash, every, resume, training.max_nonfinite_steps, training.keep_checkpoints, section)

    def phase(self, name: str = "", save_last: bool = False) -> "TrainLoop":
        """A fresh loop with these settings for one phase of a stage: checkpoints in <checkpoint_dir>/<name> (the
        same directory when `name` is empty), its own count of skipped steps."""
        directory = self.checkpoint_dir / name if self.checkpoint_dir and name else self.checkpoint_dir
        return replace(self, checkpoint_dir=directory, save_last=save_last)

    # -- the guarded optimiser step -------------------------------------------------------------------------
    def optimizer_step(self, step: int, loss: torch.Tensor | float | None, params, optimizer: torch.optim.Optimizer,
                       max_grad_norm: float) -> float:
        """Clip `params` to a total norm of `max_grad_norm` and step `optimizer` when the loss and the norm are
        finite; free the gradients either way. Returns the norm before clipping (NaN or inf on a skipped step)."""
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        grad_norm = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)  # FSDP: a DTensor
        loss_value = float(loss.detach()) if isinstance(loss, torch.Tensor) else loss
        if math.isfinite(grad_norm) and (loss_value is None or math.isfinite(loss_value)):
            optimizer.step()
            self.consecutive = 0
        else:
            self.nonfinite_steps += 1
            self.consecutive += 1
        optimizer.zero_grad(set_to_none=True)
        if self.consecutive > self.max_nonfinite_steps:
            raise UserError(self._diverged(step))
        return grad_norm

    def _diverged(self, step: int) -> str:
        if self.last_checkpoint:
            where = f"the last finite checkpoint is kept: {self.last_checkpoint}"
        elif self.checkpoint_dir and self.every:  # checkpoints are on: the run diverged before the first one
            where = (f"no checkpoint yet: the run diverged at step {step}, before the first checkpoint at step "
                     f"{self.every} ({self.section or '<section>'}.checkpoint_every is {self.every})")
        else:
            where = f"no checkpoint was written (set {self.section or '<section>'}.checkpoint_every)"
        return (f"step {step}: the loss or gradient norm was not finite on {self.consecutive} consecutive steps "
                f"(training.max_nonfinite_steps is {self.max_nonfinite_steps}); {where}")

    # -- checkpoints ----------------------------------------------------------------------------------------
    def restore(self, model: torch.nn.Module, parts: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """On `--resume`, load the newest readable checkpoint into `model` and `parts`; returns (its step, the
        values saved with it). Without one: (0, {})."""
        if not (self.resume and self.checkpoint_dir):
            return 0, {}
        found = load_latest(self.checkpoint_dir, model, self.config_hash)
        if found is None:
            return 0, {}
        self.last_checkpoint, state = found
        for name, part in parts.items():
            _restore(part, state["parts"][name], model)
        self.nonfinite_steps, self.consecutive = state["loop"]
        if distributed.current().is_main:  # a launcher's log shows where a retried task went on from
            print(f"posttrain: resumed {self.section or 'training'} at step {state['step']} from {self.last_checkpoint}", file=sys.stderr)
        return state["step"], state["values"]

    def checkpoint(self, step: int, total: int, model: torch.nn.Module, parts: dict[str, Any], values: dict[str, Any] | None = None) -> None:
        """Save a checkpoint when `step` is a multiple of `every` before the last step, and at the last step with
        `save_last` (rank 0 only)."""
        if not (self.checkpoint_dir and self.every):
            return
        if not (step < total and step % self.every == 0 or self.save_last and step == total):
            return
        weights = distributed.full_state_dict(model) if distributed.is_sharded(model) else None  # every rank gathers
        part_states = {name: _state_of(part, model) for name, part in parts.items()}
        if not distributed.current().is_main:
            return
        state = {
            "parts": part_states, "values": values or {},
            "loop": [self.nonfinite_steps, self.consecutive], "config_hash": self.config_hash,
        }
        self.last_checkpoint = save_checkpoint(self.checkpoint_dir, step, model, state, self.keep, weights)

    def metrics(self) -> dict[str, float]:
        return {"nonfinite_steps": float(self.nonfinite_steps)}
