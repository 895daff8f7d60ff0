"""Stage `compare`: compare the objectives run in one MLflow experiment (a sweep, or runs made one by one).

Launched by a sweep (Airflow, Kubeflow: `POSTTRAIN_PIPELINE_RUN` is set) it compares the arms of that sweep run
alone (its `rl` runs carry the same `pipeline_run` tag); launched by hand or by `dvc repro`, every finished `rl`
run of the experiment. For each arm (the `arm` tag of `rl` runs, a preset or an advantage estimator; older runs
without it: their `objective`; the latest finished run of each), it reads the reward
curve (`reward/total_mean` per step), the wall time of the `rl` run and the held-out greedy accuracy of the
`eval` run whose input model came from that run (lineage tags). Outputs: comparison.json, comparison.md (a
table) and reward_curves.png, all also logged to this stage's MLflow run.
"""

from __future__ import annotations

import os
from pathlib import Path

from posttrain.runtime import strict_json
from posttrain.config import Config
from posttrain.errors import UserError
from posttrain.stages import stages

CURVE = "reward/total_mean"


def latest_rl_runs(client, experiment_id: str, pipeline_run: str | None = None) -> dict[str, object]:
    """arm -> its most recent finished `rl` run (of `pipeline_run` alone, when given)."""
    query = "tags.stage = 'rl' and attributes.status = 'FINISHED'"
    if pipeline_run:
        query += f" and tags.pipeline_run = '{pipeline_run}'"
    runs = client.search_runs([experiment_id], query, order_by=["attributes.start_time DESC"])
    latest: dict[str, object] = {}
    for run in runs:
        latest.setdefault(run.data.tags.get("arm") or run.data.tags.get("objective", "?"), run)
    return latest


def heldout_accuracy(client, experiment_id: str, rl_run_id: str) -> float | None:
    evals = client.search_runs(
        [experiment_id],
        f"tags.stage = 'eval' and tags.`input.model.run_id` = '{rl_run_id}' and attributes.status = 'FINISHED'",
        order_by=["attributes.start_time DESC"],
    )
    return evals[0].data.metrics.get("greedy_accuracy") if evals else None


def comparison_rows(client, experiment_id: str, pipeline_run: str | None = None) -> tuple[list[dict], dict[str, list[tuple[int, float]]]]:
    rows, curves = [], {}
    for arm, run in sorted(latest_rl_runs(client, experiment_id, pipeline_run).items()):
        history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, CURVE))
        curves[arm] = history
        rows.append(
            {
                "arm": arm,
                "objective": run.data.tags.get("objective", "?"),
                "rl_run_id": run.info.run_id,
                "heldout_accuracy": heldout_accuracy(client, experiment_id, run.info.run_id),
                "final_reward": history[-1][1] if history else None,
                "steps": len(history),
                "wall_seconds": round((run.info.end_time - run.info.start_time) / 1000, 1),
            }
        )
    return rows, curves


def markdown_table(rows: list[dict]) -> str:
    def show(value):
        return "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)

    columns = ["arm", "objective", "heldout_accuracy", "final_reward", "steps", "wall_seconds"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(show(row[c]) for c in columns) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def curves_figure(curves: dict[str, list[tuple[int, float]]]):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for arm, points in curves.items():
        ax.plot([s for s, _ in points], [v for _, v in points], label=arm)
    ax.set_xlabel("step")
    ax.set_ylabel("mean total reward")
    ax.legend()
    fig.tight_layout()
    return fig


@stages.register("compare", inputs={}, gpu=False, deterministic=False)
def run(cfg: Config, inputs: dict[str, Path], out_dir: Path, tracker, resume: bool = False) -> dict[str, float]:
    from mlflow.tracking import MlflowClient

    from posttrain.tracking import connect

    uri, _ = connect(cfg)
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(cfg.pipeline.name)
    pipeline_run = os.environ.get("POSTTRAIN_PIPELINE_RUN") or None  # a sweep's compare: that sweep's arms alone
    rows, curves = comparison_rows(client, experiment.experiment_id, pipeline_run) if experiment else ([], {})
    if not rows:
        scope = f" of pipeline run {pipeline_run!r}" if pipeline_run else ""
        raise UserError(f"no finished rl runs{scope} in MLflow experiment {cfg.pipeline.name!r} at {uri}: run the pipeline or a sweep first")
    (out_dir / "comparison.json").write_text(strict_json(rows, indent=2) + "\n")
    (out_dir / "comparison.md").write_text(markdown_table(rows))
    figure = curves_figure(curves)
    figure.savefig(out_dir / "reward_curves.png", dpi=100)
    # each once (the staging directory also holds the run's bookkeeping, which is no artifact)
    tracker.log_table(rows, "comparison.json")
    tracker.log_figure(figure, "reward_curves.png")
    tracker.log_text(markdown_table(rows), "comparison.md")
    metrics = {"objectives": float(len(rows))}
    for row in rows:
        for key in ("heldout_accuracy", "final_reward", "wall_seconds"):
            if row[key] is not None:
                metrics[f"{row['arm']}/{key}"] = float(row[key])
    tracker.log_metrics({k.replace("+", "_"): v for k, v in metrics.items()})
    return metrics
