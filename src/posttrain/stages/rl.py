"""Stage `rl`: online RL (GRPO by default) from the SFT checkpoint, or from any checkpoint.

Inputs: `data` (train.jsonl) and `policy` (a stage output with `model/`, or a plain checkpoint directory). Output: `model/`, `history.json`
(per-step metrics), `reward_curve.png`, and `critic/` when the objective trains a critic (PPO). With `rl.eval_every` > 0 the
policy's greedy accuracy on the first `rl.eval_prompts` held-out examples (data's heldout.jsonl) at the start and every
`eval_every` steps: `heldout_accuracy` in the step's metrics, and `heldout_curve.json` / `heldout_accuracy.png`. With
`--resume` a stopped run continues from its last checkpoint.

Under torchrun with `training.sharding: fsdp` the policy and its frozen reference are FSDP2-sharded over the ranks
(`shard_for_rl`); `metrics.json` then says what each rank holds of them (`local_parameters`, `reference_local_parameters`,
and the largest rank's).
"""

from __future__ import annotations

import math
from pathlib import Path

from posttrain.runtime import strict_json
from posttrain.config import Config
from posttrain.data import check_examples, read_examples
from posttrain.stages import check_sharding, model_dir, stages
from posttrain.tasks import build_task


def reward_curve(history: list[dict[str, float]]):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    steps = range(1, len(history) + 1)
    for key in sorted({k for h in history for k in h if k.startswith("reward/") and k.endswith("_mean")}):
        ax.plot(steps, [h.get(key, float("nan")) for h in history], label=key.removeprefix("reward/").removesuffix("_mean"))
    ax.set_xlabel("step")
    ax.set_ylabel("mean reward")
    ax.legend()
    fig.tight_layout()
    return fig


def close_figure(figure) -> None:
    """pyplot keeps every figure it made until it is closed (a process running many stages would pile them up)."""
    import matplotlib.pyplot as plt

    plt.close(figure)


def heldout_figure(curve: list[dict[str, float]]):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([c["step"] for c in curve], [c["heldout_accuracy"] for c in curve], marker="o", label="greedy accuracy")
    ax.plot([c["step"] for c in curve], [c["heldout_format_rate"] for c in curve], marker=".", linestyle="--", label="format rate")
    ax.set_xlabel("step")
    ax.set_ylabel(f"held-out ({int(curve[0]['n_prompts'])} prompts)")
    ax.set_ylim(-0.02, 1.02)
    ax.legend()
    fig.tight_layout()
    return fig


class HeldoutCheck:
    """`rl.eval_every`: the policy's greedy accuracy on held-out prompts at the start and every `eval_every` steps
    (and the last), written into that step's metrics, so it is logged, checkpointed and restored with the history."""

    def __init__(self, cfg: Config, policy, tokenizer, task, heldout: list):
        self.cfg, self.policy, self.tokenizer, self.task = cfg.rl, policy, tokenizer, task
        self.examples = heldout[: cfg.rl.eval_prompts]
        self.batch_size = cfg.eval.batch_size

    def measure(self) -> dict[str, float]:
        from posttrain.eval.harness import greedy_metrics
        from posttrain.trainers import distributed

        was_training = self.policy.training
        self.policy.eval()
        with distributed.gathered(self.policy):  # FSDP: the decoder reads the whole weights (trainers/distributed.py)
            m = greedy_metrics(self.policy, self.tokenizer, self.task, self.examples, self.cfg.max_new_tokens, self.cfg.stop, self.batch_size)
        self.policy.train(was_training)
        return {"heldout_accuracy": m["greedy_accuracy"], "heldout_format_rate": m["greedy_format_rate"],
                "heldout_tokens_per_answer": m["greedy_tokens_per_answer"]}

    def on_step(self, step: int, result) -> None:
        if step % self.cfg.eval_every == 0 or step == self.cfg.steps:
            result.metrics.update(self.measure())

    def curve(self, start: dict[str, float], history: list[dict[str, float]]) -> list[dict[str, float]]:
        rows = [{"step": 0, **start}] + [{"step": i, **{k: h[k] for k in start}} for i, h in enumerate(history, 1) if "heldout_accuracy" in h]
        return [{**row, "n_prompts": float(len(self.examples))} for row in rows]


@stages.register(
    "rl",
    inputs={"data": "outputs/data", "policy": "outputs/sft"},
    requires={"data": ["train.jsonl"], "policy": ["model/config.json"]},
    resumable=True,
    rl_objective=True,  # trains with the rl section's objective: its run is tagged with it (tracking.objective_tags)
    shardable=True,  # training.sharding=fsdp: the policy and the reference (shard_for_rl)
)
def run(cfg: Config, inputs: dict[str, Path], out_dir: Path, tracker, resume: bool = False) -> dict[str, float]:
    return train_and_save(cfg, inputs, out_dir, tracker, resume)


def train_and_save(cfg: Config, inputs: dict[str, Path], out_dir: Path, tracker, resume: bool, load_models=None,
                   select_examples=None, hash_sections: tuple[str, ...] = ()) -> dict[str, float]:
    """Online RL under `cfg.rl` from `inputs["policy"]`; `load_models(tokenizer, device) -> {role: model}`
    supplies the frozen models of the roles the objective's extras read (the `distill` stage's teacher / base);
    `select_examples(train examples) -> the ones RL runs on` (rl_rm: the reward model's disjoint half);
    `hash_sections`: further config sections a resumed run must match."""
    from posttrain.models import load_pretrained, prepare_model, save_pretrained, select_device
    from posttrain.runtime import seed_everything
    from posttrain.trainers import distributed
    from posttrain.trainers.online_rl import RLRun, check_shardable
    from posttrain.trainers.rl import train_online_rl

    if cfg.training.sharding == "fsdp":  # before any work
        check_sharding(cfg)
        check_shardable(cfg.rl)
    train = inputs["data"] / "train.jsonl"
    examples = read_examples(train)
    if select_examples is not None:
        examples = select_examples(examples)
    seed_everything(cfg.pipeline.seed)
    device = select_device(cfg.pipeline.device)
    policy, tokenizer = load_pretrained(model_dir(inputs["policy"]), cfg.model.dtype)
    policy = prepare_model(policy, tokenizer, cfg.model, device)  # chat template, LoRA, checkpointing, autocast
    check_examples(train, examples, policy, tokenizer, cfg.rl.max_new_tokens, "rl.max_new_tokens")
    models = load_models(tokenizer, device) if load_models else {}
    if cfg.training.sharding == "fsdp":
        models = shard_for_rl(cfg, policy, models)
    rl_run = RLRun(
        policy=policy, tokenizer=tokenizer, task=build_task(cfg.task), examples=examples, cfg=cfg.rl, seed=cfg.pipeline.seed,
        checkpoint_dir=out_dir / "checkpoints", config_hash=cfg.section_hash("pipeline", "task", "model", "rl", *hash_sections),
        models=models,
        max_nonfinite_steps=cfg.training.max_nonfinite_steps, max_unscored_steps=cfg.training.max_unscored_steps,
        keep_checkpoints=cfg.training.keep_checkpoints,
        critic_out=out_dir / "critic",  # written only when the objective trains a critic (rl.preset: ppo)
    )
    check = heldout_check(cfg, inputs["data"], policy, tokenizer, rl_run.task)
    start = check.measure() if check else {}  # greedy: the same figures on a resumed run
    if start:
        tracker.log_metrics(start, 0)
    history, table = train_online_rl(rl_run, resume, on_log=lambda step, m: tracker.log_metrics(m, step), on_step=check.on_step if check else None)
    save_pretrained(policy, tokenizer, out_dir / "model")
    (out_dir / "history.json").write_text(strict_json(history) + "\n")
    figure = reward_curve(history)
    figure.savefig(out_dir / "reward_curve.png", dpi=100)
    tracker.log_figure(figure, "reward_curve.png")
    close_figure(figure)
    if check:
        curve = check.curve(start, history)
        (out_dir / "heldout_curve.json").write_text(strict_json(curve) + "\n")
        figure = heldout_figure(curve)
        figure.savefig(out_dir / "heldout_accuracy.png", dpi=100)
        tracker.log_figure(figure, "heldout_accuracy.png")
        close_figure(figure)
    tracker.log_table(table, "rollout_samples.json")
    tracker.log_artifacts(out_dir / "model", "model")
    last = history[-10:]
    metrics = {
        "final_reward": sum(h["reward/total_mean"] for h in last) / len(last),
        "steps": float(len(history)),
        "nonfinite_steps": history[-1]["nonfinite_steps"],
    }
    if check:
        metrics["heldout_accuracy_start"], metrics["heldout_accuracy_end"] = curve[0]["heldout_accuracy"], curve[-1]["heldout_accuracy"]
    accuracy = history_accuracy(last)
    if accuracy is not None:  # measured by the task's verifier; a run that measured none reports none
        metrics["final_train_accuracy"] = accuracy
    if cfg.training.sharding == "fsdp":  # what each rank holds (its shards): a collective, every rank gets here
        metrics["parameters"] = float(sum(p.numel() for p in policy.parameters()))
        metrics.update(distributed.shard_sizes(policy))
        if "reference" in models:
            metrics.update({f"reference_{k}": v for k, v in distributed.shard_sizes(models["reference"]).items()})
    return metrics


def shard_for_rl(cfg: Config, policy, models: dict) -> dict:
    """training.sharding=fsdp: the policy sharded over torchrun's ranks (its gradients averaged over them, as the
    replicas' are), after its frozen reference was copied from it when the objective reads one (`rl.beta` > 0, ...),
    which is sharded too; returns the frozen models by role."""
    from posttrain.trainers import distributed
    from posttrain.trainers.extras import roles_needed
    from posttrain.trainers.online_rl import starting_reference

    models = dict(models)
    if "reference" in roles_needed(cfg.rl) and "reference" not in models:
        models["reference"] = distributed.shard_model(starting_reference(policy), frozen=True)
    distributed.shard_model(policy, average=True)
    return models


def heldout_check(cfg: Config, data: Path, policy, tokenizer, task) -> HeldoutCheck | None:
    """The periodic held-out check when `rl.eval_every` asks for one; a run without held-out data or a verifier
    cannot have one (one line)."""
    from posttrain.errors import UserError

    if cfg.rl.eval_every == 0:
        return None
    heldout = data / "heldout.jsonl"
    if not heldout.is_file() or not hasattr(task, "correctness_reward"):
        raise UserError(f"rl.eval_every={cfg.rl.eval_every} needs held-out examples with a verifier ({heldout} and a task with answers); set rl.eval_every=0")
    return HeldoutCheck(cfg, policy, tokenizer, task, read_examples(heldout))


def history_accuracy(history: list[dict[str, float]]) -> float | None:
    """The mean verifier accuracy over the steps that measured one (a finite `accuracy`), or None."""
    measured = [h["accuracy"] for h in history if math.isfinite(h.get("accuracy", float("nan")))]
    return sum(measured) / len(measured) if measured else None
