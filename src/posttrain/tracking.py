"""MLflow tracking: one experiment per pipeline, one run per stage.

Runs are tagged `stage`, `objective`, `git_sha` and `launcher`; params are the flattened config; stages
log per-step metrics, tables, figures and artifacts through the `Tracker` they are handed. With
`tracking.enabled: false` every call is a no-op, so stage code never checks.
"""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from posttrain.config import Config


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def git_sha() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def resolve_uri(uri: str) -> str:
    """Make a relative `sqlite:///file.db` absolute so the same store is found from any directory."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri[len(prefix) :].startswith("/"):
        return prefix + str(Path(uri[len(prefix) :]).resolve())
    return uri


class Tracker:
    """What a stage logs through; backed by the active MLflow run (or nothing)."""

    def __init__(self, mlflow_module=None, run_id: str | None = None):
        self._mlflow = mlflow_module
        self.run_id = run_id

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        if self._mlflow:
            # asynchronous: MLflow batches per-step metrics in a background thread and flushes at end_run
            self._mlflow.log_metrics({k: float(v) for k, v in metrics.items()}, step=step, synchronous=False)

    def log_table(self, rows: list[dict[str, Any]], artifact_file: str) -> None:
        if self._mlflow and rows:
            columns = {key: [row[key] for row in rows] for key in rows[0]}
            self._mlflow.log_table(columns, artifact_file=artifact_file)

    def log_figure(self, figure, artifact_file: str) -> None:
        if self._mlflow:
            self._mlflow.log_figure(figure, artifact_file)

    def log_text(self, text: str, artifact_file: str) -> None:
        if self._mlflow:
            self._mlflow.log_text(text, artifact_file)

    def log_artifacts(self, local_dir: Path, artifact_path: str) -> None:
        if self._mlflow:
            self._mlflow.log_artifacts(str(local_dir), artifact_path)

    def set_tags(self, **tags: str) -> None:
        """Set (or overwrite) tags of the run, e.g. a stage whose objective differs from the rl section's."""
        if self._mlflow:
            self._mlflow.set_tags(tags)


@contextmanager
def stage_run(cfg: Config, stage: str, launcher: str, run_id: str | None = None, extra_tags: Mapping[str, str] | None = None) -> Iterator[Tracker]:
    """Open (or, given `run_id`, reopen) the stage's MLflow run; mark it FAILED if the stage raises."""
    if not cfg.tracking.enabled:
        yield Tracker()
        return
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    import mlflow

    logging.getLogger("mlflow").setLevel(logging.WARNING)  # table-creation chatter on a new store

    mlflow.set_tracking_uri(resolve_uri(cfg.tracking.uri))
    experiment = mlflow.get_experiment_by_name(cfg.pipeline.name)
    if experiment is None:
        location = Path(cfg.tracking.artifact_root).resolve().as_uri() if "://" not in cfg.tracking.artifact_root else cfg.tracking.artifact_root
        experiment_id = mlflow.create_experiment(cfg.pipeline.name, artifact_location=location)
    else:
        experiment_id = experiment.experiment_id
    tags = {"stage": stage, "objective": f"{cfg.rl.advantage}+{cfg.rl.loss}", "git_sha": git_sha(), "launcher": launcher}
    if os.environ.get("POSTTRAIN_PIPELINE_RUN"):  # set by Kubeflow / Airflow: lets their exit task find the runs
        tags["pipeline_run"] = os.environ["POSTTRAIN_PIPELINE_RUN"]
    tags.update(extra_tags or {})
    with mlflow.start_run(run_id=run_id, experiment_id=experiment_id, run_name=None if run_id else stage, tags=tags) as run:
        if run_id is None:
            params = flatten(cfg.model_dump(mode="json"))
            items = list(params.items())
            for i in range(0, len(items), 90):  # MLflow accepts at most 100 params per batch
                mlflow.log_params(dict(items[i : i + 90]))
        yield Tracker(mlflow, run.info.run_id)
