"""Claim (AURA, spec §12): PPO on the terminal direction-magnitude score raises the score, the directional accuracy
and the conditional magnitude agreement of an SFT tool-use policy in the chronological market sandbox.

Per seed: SFT of a tiny model on the scripted analyst's demonstrations (task `market`, recipes/aura/params.yaml), then PPO
(rl.preset ppo: GAE over a value head on a copy of the SFT policy, clipped value loss, critic warm-up) with the
reward `aura`. Both are evaluated greedily on the held-out decisions (later days than every train decision, episodes
played in the sandbox): score = mean R (in %), directional accuracy, conditional magnitude agreement (mean mag where
the direction is right), the share of each tool in the calls. The analyst's own figures on the same decisions are
reported as a reference. Arms in the table: `sft`, `ppo`, `analyst`.

    .venv/bin/python experiments/aura_ppo.py [--steps N] [--seeds 3] [--json FILE] [--micro]

--params defaults to recipes/aura/params.yaml.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import _common as C
from posttrain.recipes.aura.market import TOOLS



def figures(metrics: dict, prefix: str = "greedy") -> dict:
    """Score (%), directional accuracy, conditional magnitude agreement and tool shares from the eval's metrics."""
    direction, hit = metrics[f"{prefix}_direction"], metrics[f"{prefix}_direction_and_magnitude"]
    calls = sum(metrics[f"{prefix}_calls_{t}"] for t in TOOLS)
    return {"score": 100.0 * hit, "directional_accuracy": direction, "magnitude_agreement": hit / direction if direction else 0.0,
            "format_rate": metrics[f"{prefix}_format_rate"], "calls_per_episode": metrics[f"{prefix}_tool_calls"],
            **{f"share_{t}": metrics[f"{prefix}_calls_{t}"] / calls if calls else 0.0 for t in TOOLS}}


def analyst_figures(task, held) -> dict:
    """The scripted analyst on the held-out decisions (its demonstrations are what SFT imitates)."""
    from posttrain.recipes.aura.market import parse_prompt, scripted_analyst

    rng = random.Random(0)
    rows = [task.sample_metrics(scripted_analyst(task.sandbox, *parse_prompt(e.prompt), rng), e) for e in held]
    mean = {f"greedy_{k}": sum(r[k] for r in rows) / len(rows) for k in rows[0]}
    return figures({**mean, "greedy_format_rate": 1.0})


def main() -> None:
    args = C.parse_args(__doc__.split("\n")[0], 100)
    if args.params == C.REPO / "params.yaml":
        args.params = C.REPO / "recipes" / "aura" / "params.yaml"
    t0 = time.time()
    micro = ["task.n_train=30", "task.n_heldout=6", "model.max_positions=64", "eval.n_prompts=6", "rl.max_new_tokens=24",
             "eval.max_new_tokens=24", "rl.critic.warmup_steps=1", "rl.prompts_per_step=2", "rl.group_size=3"] if args.micro else []
    cfg = C.load_config(args, micro)
    task, train, held, path, sft = C.sft_start(cfg, args.seed)
    held = held[: cfg.eval.n_prompts]
    varied = []  # per step: the share of groups whose `aura` rewards are not all equal (PPO has something to learn)

    def on_step(step, result):
        column = result.batch.rewards[:, result.batch.reward_names.index("aura")]
        groups = column.view(-1, cfg.rl.group_size)
        varied.append(float((groups.max(1).values > groups.min(1).values).float().mean()))

    history, after, seconds = C.run_arm(cfg, cfg.rl, task, train, held, path, args.seed, on_step=on_step)
    rows = [{"arm": "sft", **figures(sft)}, {"arm": "ppo", **figures(after)}, {"arm": "analyst", **analyst_figures(task, held)}]
    k = max(1, len(history) // 5)
    train_curve = {key: C.curve(history, key) for key in ("reward/aura_mean", "reward/aura_direction_mean", "reward/aura_magnitude_mean",
                                                          "value/explained_variance", *(f"tools/share_{t}" for t in TOOLS))}
    for r in rows:
        r.update({"train_score_first": 100 * C.window_mean(history, "reward/aura_mean", True, k) if r["arm"] == "ppo" else float("nan"),
                  "train_score_last": 100 * C.window_mean(history, "reward/aura_mean", False, k) if r["arm"] == "ppo" else float("nan")})
    text = C.print_table(f"\nAURA on the market sandbox: SFT -> PPO, {args.steps} steps, seed {args.seed}, {len(held)} held-out decisions", rows)
    informative = sum(varied) / len(varied)
    runs = {}
    if cfg.tracking.enabled:
        runs["ppo"] = C.log_arm(cfg, "aura_ppo/ppo", history, {f"heldout_{k}": v for k, v in rows[1].items() if k != "arm"}, rows, text)
    C.write_json(args, {
        "claim": "aura_ppo", "steps": args.steps, "seed": args.seed, "table": rows, "train_curve": train_curve,
        "informative_groups": informative, "ppo_seconds": round(seconds, 1), "mlflow_runs": runs, "runtime_s": round(time.time() - t0, 1),
        "params": str(Path(args.params).resolve().relative_to(C.REPO)) if Path(args.params).resolve().is_relative_to(C.REPO) else str(args.params),
    })


if __name__ == "__main__":
    C.run_seeds(main, "aura_ppo")
