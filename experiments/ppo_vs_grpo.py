"""Claim: PPO with a learned critic (preset `ppo`: GAE over a value head on a copy of the policy, clipped value loss,
critic warm-up) learns the arithmetic task from the SFT start, as GRPO does, on the same rollout budget.

One seed (`--seed`; the claims harness runs 3): arms from the same SFT checkpoint, `grpo` (preset grpo) and `ppo`
(preset ppo). Same prompts per step, group size, steps and learning rate; PPO's critic has its own learning rate
(rl.critic.lr) and warm-up. The results table has one row per arm: held-out greedy accuracy before (SFT) and after
RL, the gain, and for PPO the explained variance of the critic over the last fifth of the steps.

The harness (experiments/_claims.py) pairs the arms by seed: PPO's and GRPO's held-out accuracy after RL against
the SFT start's (each learns), and PPO against GRPO (held-out accuracy after RL from the same start, so the paired
difference is the difference of the gains). The harness's verdicts are one-sided: "PPO matches GRPO" shows as an
inconclusive PPO > GRPO row whose interval is narrow around 0.

    .venv/bin/python experiments/claims.py --claim ppo_vs_grpo
    .venv/bin/python experiments/ppo_vs_grpo.py [--steps N] [--seeds 3] [--json FILE] [--micro]
"""

from __future__ import annotations

import _common as C
from posttrain import resolve

ARMS = ("grpo", "ppo")


def resolve_preset(cfg, arm: str) -> dict:
    """The rl keys preset `arm` sets (presets apply below explicit settings, so they are expanded here)."""
    from posttrain.objectives.presets import expand

    return {k: tuple(v) if k == "aux" else v for k, v in expand(arm, cfg.rl.model_dump()).items()}


def main() -> None:
    """One seed (`--seed`): each arm's held-out greedy accuracy before and after RL, as the results table."""
    args = C.parse_args(__doc__.split("\n")[0], 150)
    cfg = C.load_config(args, [])
    task, train, held, path, sft = C.sft_start(cfg, args.seed)
    table, last = [], {}
    for arm in ARMS:
        rl_cfg = resolve.updated(cfg.rl, "rl", preset=arm, **resolve_preset(cfg, arm))
        history, after, seconds = C.run_arm(cfg, rl_cfg, task, train, held, path, args.seed)
        row = {"arm": arm, "heldout_greedy_before": sft["greedy_accuracy"], "heldout_greedy_after": after["greedy_accuracy"],
               "gain": after["greedy_accuracy"] - sft["greedy_accuracy"], "seconds": round(seconds, 1)}
        if arm == "ppo":
            row["explained_variance_last"] = C.window_mean(history, "value/explained_variance", False, max(1, len(history) // 5))
        table.append(row)
        last[arm] = (history, cfg.model_copy(update={"rl": rl_cfg}), after)
        print(f"seed {args.seed} {arm}: SFT {sft['greedy_accuracy']:.3f} -> {after['greedy_accuracy']:.3f} ({seconds:.0f}s)", flush=True)
    text = C.print_table(f"\nPPO vs GRPO on arithmetic, {args.steps} steps, seed {args.seed}", table)
    runs = {}
    if cfg.tracking.enabled:
        for row in table:
            history, arm_cfg, after = last[row["arm"]]
            final = {"gain": row["gain"], **{f"heldout_{k}": v for k, v in after.items()}}
            runs[row["arm"]] = C.log_arm(arm_cfg, f"ppo_vs_grpo/{row['arm']}", history, final, table, text)
    C.write_json(args, {"claim": "ppo_vs_grpo", "steps": args.steps, "seed": args.seed, "table": table, "mlflow_runs": runs})


if __name__ == "__main__":
    C.run_seeds(main, "ppo_vs_grpo")
