"""Pipeline stages: `run(cfg, inputs, out_dir, tracker, resume) -> metrics`, registered by name.

`execute` is what every launcher ends up calling (through the CLI). It checks the inputs, runs the stage
into a staging directory next to `out_dir`, writes `metrics.json`, and only then swaps the staging
directory into place, so an interrupted or failed stage never leaves a half-written output and never
damages the previous one. A resumable stage keeps its staging directory (with its checkpoints) when it
fails, so `--resume` can continue from it.

One process at a time writes an output (`locks.OutputLock` on `.<out>.lock`). The tracking stores are checked
before any work; if they fail after it, the output is still swapped into place (the model is kept) and the stage
ends with `TrackingIncomplete`, one line naming what failed and the `posttrain relog` command that sends the rest.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path

from posttrain.runtime import fault_point, strict_json
from posttrain.config import Config
from posttrain.errors import TrackingIncomplete, UserError
from posttrain.locks import OutputLock
from posttrain.registry import Entry, Registry
from posttrain.storage import MODEL, model_dir  # noqa: F401  (the stages read their model inputs through it)

stages: Registry = Registry("stage")
# the settings sections recipes and plugins add (`sections.register("dsp", help=..., default=...)(DSPConfig)`): with the
# core sections of `config.Config` they make the settings of a run (`posttrain.resolve.settings_model`); meta `check`:
# check(section, registries) raises UserError (one line) on a rule across the section and the registries (resolve.check)
sections: Registry = Registry("settings section")
# registry meta of a stage: inputs {name: default dir}, requires {name: [files]}, resumable, sections (the added sections it
# reads: its settings are the core sections and these, posttrain.resolve.settings_model(stage)); for the launchers
# (orchestration/graph.py): gpu (default True), deterministic (default True: cacheable); for tracking: rl_objective (default
# False: whether the stage trains with the rl section's objective, so its run is tagged with the objective and arm)

def check_sharding(cfg: Config) -> None:
    """What a `shardable` stage refuses under training.sharding=fsdp whatever it trains (with or without torchrun): LoRA."""
    if cfg.training.sharding == "fsdp" and cfg.model.lora.r > 0:
        raise UserError("training.sharding=fsdp does not support LoRA (model.lora.r > 0); use training.sharding=replicate")


def _present(path: Path, needed: str) -> bool:
    """Whether input `path` has `needed`; a stage output's `model/<file>` is also found in a plain checkpoint directory."""
    head, _, rest = needed.partition("/")
    return (path / needed).exists() or (head == MODEL and rest != "" and (model_dir(path) / rest).exists())


from posttrain.stages import compare, data, distill, eval, preference, reward_model, rl, rl_rm, sft  # noqa: E402,F401,A004  (registers)
from posttrain.stages import import_model  # noqa: E402,F401  (registers: import, a GGUF file or checkpoint into the pipeline)

RUN_FILE = "mlflow_run.json"  # in every stage output: which stage and MLflow run made it (lineage for `compare`)


def staging_dir(out_dir: Path) -> Path:
    return out_dir.parent / f".{out_dir.name}.partial"


def write_json_atomic(path: Path, payload) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(strict_json(payload, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)


def check_inputs(name: str, inputs: dict[str, Path]) -> dict[str, Path]:
    wanted = stages.entry(name).meta.get("inputs", {})
    unknown = set(inputs) - set(wanted)
    if unknown:
        raise UserError(f"stage {name!r} takes no input {sorted(unknown)[0]!r}; it takes {', '.join(wanted) or 'none'}")
    resolved = {key: Path(inputs.get(key, default)) for key, default in wanted.items()}
    for key, path in resolved.items():
        if not path.is_dir():
            raise UserError(f"input {key!r} not found: {path} (run the upstream stage or pass --in {key}=DIR)")
        for needed in stages.entry(name).meta.get("requires", {}).get(key, ()):
            if not _present(path, needed):
                plain = " (or a checkpoint directory with config.json)" if needed.startswith(f"{MODEL}/") else ""
                raise UserError(f"input {key!r} has no {needed}: {path / needed} is missing{plain}")
    return resolved


def _prepare_runtime(cfg: Config) -> None:  # heavy imports happen here, after the cheap checks
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # weight loading/saving bars are noise next to ours
    if cfg.pipeline.threads:
        torch.set_num_threads(cfg.pipeline.threads)


def execute(name: str, cfg: Config, inputs: dict[str, Path], out_dir: Path, launcher: str = "cli", resume: bool = False,
            locked: bool = False) -> dict[str, float]:
    """Run stage `name` into `out_dir`; `locked`: the caller already holds its OutputLock (the CLI takes it first)."""
    from posttrain.tracking import check_stores

    entry = stages.entry(name)
    resolved = check_inputs(name, inputs)
    resumable = entry.meta.get("resumable", False)
    if resume and not resumable:
        raise UserError(f"stage {name!r} cannot --resume; only {', '.join(e.name for e in stages if e.meta.get('resumable'))} can")
    if cfg.training.sharding == "fsdp" and not entry.meta.get("shardable", False):  # it would train whole replicas, silently
        shardable = " and ".join(sorted(e.name for e in stages if e.meta.get("shardable")))
        raise UserError(f"training.sharding=fsdp is supported by the {shardable} stages only so far; set training.sharding=replicate for {name}")
    problems = check_stores(cfg)  # a dead tracking server or artifact store fails here, in seconds, not after training
    if problems:
        raise UserError("cannot track this run (nothing was run): " + "; ".join(problems))
    _prepare_runtime(cfg)
    out_dir = Path(out_dir)
    from posttrain.trainers import distributed

    if not distributed.init().is_main:  # torchrun: rank 0 alone writes the output and logs to MLflow
        return _run_replica(name, cfg, resolved, staging_dir(out_dir), resume and resumable)
    with contextlib.nullcontext() if locked else OutputLock(out_dir):  # one writer per output: its staging directory and the swap are ours alone
        return _run_locked(entry, cfg, resolved, out_dir, launcher, resume and resumable)


def _run_locked(entry: Entry, cfg: Config, inputs: dict[str, Path], out_dir: Path, launcher: str, resume: bool) -> dict[str, float]:
    """The stage into its staging directory, then swapped into place. A run id left in the staging directory is
    that of a writer that is gone (we hold the lock): reopened by `--resume`, otherwise marked KILLED (it was
    killed, or it would have ended its run) before the directory is cleared."""
    from posttrain.tracking import PENDING, drop_empty_run, mark_killed, stage_run

    staging = staging_dir(out_dir)
    run_id_file = staging / "mlflow_run_id"
    _finish_interrupted_swap(staging, out_dir)
    recorded = run_id_file.read_text().strip() if run_id_file.is_file() else None
    if not resume:
        if recorded:
            mark_killed(cfg, recorded)
        shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(staging / PENDING, ignore_errors=True)  # an earlier attempt's unsent log: its redone steps log again
    tracker = None
    try:
        with stage_run(cfg, entry.name, launcher, recorded if resume else None, _lineage_tags(inputs), root=staging,
                       rl_objective=entry.meta.get("rl_objective", False)) as tracker:
            if tracker.run_id:
                run_id_file.write_text(tracker.run_id)
            metrics = entry.obj(cfg, inputs, staging, tracker=tracker, resume=resume)
            write_json_atomic(staging / "metrics.json", metrics)
            write_json_atomic(staging / RUN_FILE, {"stage": entry.name, "run_id": tracker.run_id})
    except BaseException as e:
        if not (entry.meta.get("resumable", False) and any((staging / "checkpoints").rglob("step-*"))):
            shutil.rmtree(staging, ignore_errors=True)
            if isinstance(e, UserError) and tracker is not None and not (resume and recorded):  # stopped before any work: no empty run left
                drop_empty_run(cfg, tracker)
        raise
    run_id_file.unlink(missing_ok=True)
    _swap_into_place(staging, out_dir)
    if tracker.failure:  # the output is complete and in place; only its log is not
        raise TrackingIncomplete(f"stage {entry.name!r} finished and {out_dir} is complete, but MLflow logging failed: {tracker.failure}; "
                                 f"its MLflow run stays RUNNING until `posttrain relog --out {out_dir}` (with the same --params/--set) "
                                 "sends the rest and finishes the run")
    return metrics


def _run_replica(name: str, cfg: Config, inputs: dict[str, Path], main_staging: Path, resume: bool) -> dict[str, float]:
    """A data-parallel replica (rank > 0): the same stage, untracked, into a scratch directory that is dropped.
    On resume it reads rank 0's checkpoints (only rank 0 writes them; they must be on storage both can read)."""
    import tempfile

    from posttrain.tracking import Tracker

    with tempfile.TemporaryDirectory(prefix=f"posttrain-{name}-replica-") as scratch:
        if resume and (main_staging / "checkpoints").is_dir():
            (Path(scratch) / "checkpoints").symlink_to((main_staging / "checkpoints").resolve())
        return stages.entry(name).obj(cfg, inputs, Path(scratch), tracker=Tracker(), resume=resume)


def _lineage_tags(inputs: dict[str, Path]) -> dict[str, str]:
    """`input.<name>.stage` / `.run_id` of each input made by a tracked stage."""
    tags = {}
    for key, path in inputs.items():
        made_by = path / RUN_FILE
        if made_by.is_file():
            record = json.loads(made_by.read_text())
            tags.update({f"input.{key}.stage": str(record["stage"]), f"input.{key}.run_id": str(record["run_id"])})
    return tags


def _swap_into_place(staging: Path, out_dir: Path) -> None:
    shutil.rmtree(staging / "checkpoints", ignore_errors=True)
    fault_point("swap:checkpoints-dropped")
    old = out_dir.parent / f".{out_dir.name}.old"
    shutil.rmtree(old, ignore_errors=True)
    if out_dir.exists():
        out_dir.rename(old)
    fault_point("swap:old-moved")
    staging.rename(out_dir)
    fault_point("swap:new-in-place")
    shutil.rmtree(old, ignore_errors=True)


def _finish_interrupted_swap(staging: Path, out_dir: Path) -> None:
    """A writer killed inside `_swap_into_place` (we hold the lock now: it is gone) left either a complete output in
    the staging directory (its RUN_FILE written, its run id file removed: nothing of the stage is left to do) or the
    previous output moved aside as `.old`: finish its swap, or put the previous output back, so that no completed
    output is lost to the directory cleanup that follows."""
    old = out_dir.parent / f".{out_dir.name}.old"
    if (staging / RUN_FILE).is_file() and not (staging / "mlflow_run_id").exists():
        _swap_into_place(staging, out_dir)
    elif old.is_dir() and not out_dir.exists():
        old.rename(out_dir)
    shutil.rmtree(old, ignore_errors=True)
