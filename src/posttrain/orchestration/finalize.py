"""After a pipeline run: mark its MLflow runs that are still RUNNING as FAILED, and remove its leftovers.

A stage that raises marks its own run FAILED (tracking.stage_run); a stage that is killed (evicted pod,
timeout, OOM) cannot, so the launcher's exit handler / teardown calls this with the pipeline run id that
every stage run of that pipeline run is tagged with (`pipeline_run`).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from posttrain.config import Config
from posttrain.tracking import connect


def mark_unfinished_failed(cfg: Config, pipeline_run: str, reason: str) -> list[str]:
    """Runs of `pipeline_run` still RUNNING -> FAILED, tagged with `reason`; returns their ids."""
    if not cfg.tracking.enabled:
        return []
    from mlflow.tracking import MlflowClient

    client = MlflowClient(connect(cfg)[0])
    experiment = client.get_experiment_by_name(cfg.pipeline.name)
    if experiment is None:
        return []
    runs = client.search_runs(
        [experiment.experiment_id], filter_string=f"tags.pipeline_run = '{pipeline_run}' and attributes.status = 'RUNNING'"
    )
    for run in runs:
        client.set_tag(run.info.run_id, "failure", reason)
        client.set_terminated(run.info.run_id, status="FAILED")
    return [run.info.run_id for run in runs]


def remove_leftovers(root: Path) -> list[Path]:
    """Half-written stage outputs (`.X.partial` staging dirs without checkpoints, `.X.old`) under `root`."""
    removed = []
    for path in sorted(root.rglob(".*.old")) + sorted(root.rglob(".*.partial")):
        if path.is_dir() and not any((path / "checkpoints").rglob("step-*")):  # checkpoints let a retry resume
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed
