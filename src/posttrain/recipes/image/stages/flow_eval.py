"""Stage `flow_eval`: IA / BP / QP and overall = mean(IA, BP, QP) of the SFT and RL flow models on held-out edits.

Inputs `data` (curate), `sft` and `rl` (flow models). Both models sample from the same initial noise with the
deterministic Euler sampler; the metrics give each judge, the overall score and the relative change of the
overall score from SFT to RL in % (CrossTimeEdit's headline number). Output: metrics, samples.png
(source / target / SFT / RL per row), logged to MLflow with per-edit scores.
"""

from __future__ import annotations

from pathlib import Path

from posttrain.config import Config
from posttrain.stages import stages


def edit_grid(rows: list[tuple[str, list]]):
    """A figure with one column per (title, images [N, 3, H, W] in [0, 1]) entry and one row per edit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(rows[0][1])
    fig, axes = plt.subplots(n, len(rows), figsize=(1.6 * len(rows), 1.6 * n), squeeze=False)
    for c, (title, images) in enumerate(rows):
        for r in range(n):
            axes[r][c].imshow(images[r].permute(1, 2, 0).clamp(0, 1).numpy())
            axes[r][c].axis("off")
        axes[0][c].set_title(title, fontsize=7)
    fig.tight_layout()
    return fig


@stages.register(
    "flow_eval",
    sections=("flow", "flow_rl", "flow_eval"),
    inputs={"data": "outputs/images/curate", "sft": "outputs/images/flow_sft", "rl": "outputs/images/flow_rl"},
    requires={"data": ["quadruplets.parquet", "images.npz"], "sft": ["model/flow_config.json"], "rl": ["model/flow_config.json"]},
)
def run(cfg: Config, inputs: dict[str, Path], out_dir: Path, tracker, resume: bool = False) -> dict[str, float]:
    import torch

    from posttrain.recipes.image.vigor.edits import load_edits
    from posttrain.recipes.image.eval import judge_edits
    from posttrain.recipes.image.flow import load_flow_model

    ev = cfg.flow_eval
    edits = load_edits(inputs["data"], "heldout", cfg.flow.image_size)
    edits = edits.take(list(range(min(ev.n_prompts, len(edits)))))
    index = torch.arange(len(edits)).repeat_interleave(ev.samples_per_prompt)
    batch = edits.take(index)
    metrics: dict[str, float] = {"n_edits": float(len(edits))}
    generated, table = {}, []
    for name in ("sft", "rl"):
        model = load_flow_model(inputs[name] / "model").eval()
        scores, names, generated[name] = judge_edits(model, batch, cfg.flow_rl.rewards, ev.sampling_steps, cfg.pipeline.seed)
        for k, judge in enumerate(names):
            metrics[f"{name}_{judge}"] = float(scores[:, k].mean())
        metrics[f"{name}_overall"] = float(scores.mean())  # overall = mean of the judges, in [0, 1]
        table += [{"model": name, "instruction": batch.instructions[i], "change": batch.changes[i],
                   **{judge: float(scores[i, k]) for k, judge in enumerate(names)}} for i in range(len(index))]
    metrics["overall_change_pct"] = 100 * (metrics["rl_overall"] - metrics["sft_overall"]) / max(metrics["sft_overall"], 1e-8)
    tracker.log_metrics(metrics)
    tracker.log_table(table, "scores.json")
    rows = index.new_tensor(range(0, min(ev.n_grid, len(edits)) * ev.samples_per_prompt, ev.samples_per_prompt))
    if len(rows):
        judged = batch.judged()
        figure = edit_grid([("S_new (source)", judged.source[rows]), ("S_old (target)", judged.target[rows]),
                            ("SFT", generated["sft"][rows]), ("RL", generated["rl"][rows])])
        figure.savefig(out_dir / "samples.png", dpi=100)
        tracker.log_figure(figure, "samples.png")
    return metrics
