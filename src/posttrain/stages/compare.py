"""Stage `compare`: compare the objectives run in one MLflow experiment (a sweep, or runs made one by one).

For each objective (the `objective` tag of `rl` runs; the latest finished run of each), it reads the reward
curve (`reward/total_mean` per step), the wall time of the `rl` run and the held-out greedy accuracy of the
`eval` run whose input model came from that run (lineage tags). Outputs: comparison.json, comparison.md (a
table) and reward_curves.png, all also logged to this stage's MLflow run.
"""

from __future__ import annotations

from pathlib import Path

from posttrain.runtime import strict_json
from posttrain.config import Config
from posttrain.errors import UserError
from posttrain.stages import stages

CURVE = "reward/total_mean"


def latest_rl_runs(client, experiment_id: str) -> dict[str, object]:
    """objective -> its most recent finished `rl` run."""
    runs = client.search_runs([experiment_id], "tags.stage = 'rl' and attributes.status = 'FINISHED'", order_by=["attributes.start_time DESC"])
    latest: dict[str, object] = {}
    for run in runs:
        latest.setdefault(run.data.tags.get("objective", "?"), run)
    return latest


def heldout_accuracy(client, experiment_id: str, rl_run_id: str) -> float | None:
    evals = client.search_runs(
        [experiment_id],
        f"tags.stage = 'eval' and tags.`input.model.run_id` = '{rl_run_id}' and attributes.status = 'FINISHED'",
        order_by=["attributes.start_time DESC"],
    )
    return evals[0].data.metrics.get("greedy_accuracy") if evals else None


def comparison_rows(client, experiment_id: str) -> tuple[list[dict], dict[str, list[tuple[int, float]]]]:
    rows, curves = [], {}
    for objective, run in sorted(latest_rl_runs(client, experiment_id).items()):
        history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, CURVE))
        curves[objective] = history
        rows.append(
            {
                "objective": objective,
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

    columns = ["objective", "heldout_accuracy", "final_reward", "steps", "wall_seconds"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(show(row[c]) for c in columns) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def curves_figure(curves: dict[str, list[tuple[int, float]]]):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for objective, points in curves.items():
        ax.plot([s for s, _ in points], [v for _, v in points], label=objective)
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
    rows, curves = comparison_rows(client, experiment.experiment_id) if experiment else ([], {})
    if not rows:
        raise UserError(f"no finished rl runs in MLflow experiment {cfg.pipeline.name!r} at {uri}: run the pipeline or a sweep first")
    (out_dir / "comparison.json").write_text(strict_json(rows, indent=2) + "\n")
    (out_dir / "comparison.md").write_text(markdown_table(rows))
    figure = curves_figure(curves)
    figure.savefig(out_dir / "reward_curves.png", dpi=100)
    tracker.log_table(rows, "comparison.json")
    tracker.log_figure(figure, "reward_curves.png")
    tracker.log_artifacts(out_dir, "comparison")
    metrics = {"objectives": float(len(rows))}
    for row in rows:
        for key in ("heldout_accuracy", "final_reward", "wall_seconds"):
            if row[key] is not None:
                metrics[f"{row['objective']}/{key}"] = float(row[key])
    tracker.log_metrics({k.replace("+", "_"): v for k, v in metrics.items()})
    return metrics
