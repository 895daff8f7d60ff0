"""Claim: PPO with a learned critic (preset `ppo`: GAE over a value head on a copy of the policy, clipped value loss,
critic warm-up) learns the arithmetic task from the SFT start, as GRPO does, on the same rollout budget.

Arms from the same SFT checkpoint per seed: `grpo` (preset grpo) and `ppo` (preset ppo). Same prompts per step,
group size, steps and learning rate; PPO's critic has its own learning rate (rl.critic.lr) and warm-up.
Reported per seed and arm: held-out greedy accuracy before (SFT) and after RL, the gain, PPO's final explained
variance; over seeds: the mean gain of each arm and the paired PPO - GRPO difference with a 95% t interval
(n - 1 degrees of freedom). Verdicts: "PPO learns" is reproduced when PPO's gain interval lies above 0,
contradicted when it lies below or at 0, else inconclusive; "PPO matches GRPO" is reported the same way on the
difference (reproduced when the interval holds 0 and is within +-0.1, contradicted when it excludes 0).

    .venv/bin/python experiments/ppo_vs_grpo.py [--steps N] [--seeds 3] [--json FILE] [--micro]
"""

from __future__ import annotations

import math
import statistics
import time

import _common as C
from posttrain import resolve

ARMS = ("grpo", "ppo")
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}  # t quantiles, n - 1 df


def interval(values: list[float]) -> tuple[float, float, float]:
    """(mean, low, high): the 95% t interval of the mean (a single value: the mean, unbounded)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, -math.inf, math.inf
    half = T_975.get(len(values) - 1, 1.96) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def verdict_positive(low: float, high: float) -> str:
    return "reproduced" if low > 0 else "contradicted" if high <= 0 else "inconclusive"


def verdict_match(low: float, high: float, margin: float = 0.1) -> str:
    if low > 0 or high < 0:
        return "contradicted"
    return "reproduced" if -margin <= low and high <= margin else "inconclusive"


def main() -> None:
    args = C.parse_args(__doc__.split("\n")[0], 150)  # --seed / --seeds from the claims harness
    t0 = time.time()
    seeds = list(range(args.seed, args.seed + args.seeds))
    per_seed, arms = [], {a: {"gains": [], "_history": [], "_cfg": None} for a in ARMS}
    for seed in seeds:
        args_seed = type(args)(**{**vars(args), "seed": seed})
        cfg = C.load_config(args_seed, [])
        task, train, held, path, sft = C.sft_start(cfg, seed)
        row = {"seed": seed, "sft_greedy": sft["greedy_accuracy"]}
        for arm in ARMS:
            rl_cfg = resolve.updated(cfg.rl, "rl", preset=arm, **resolve_preset(cfg, arm))
            history, after, seconds = C.run_arm(cfg, rl_cfg, task, train, held, path, seed)
            gain = after["greedy_accuracy"] - sft["greedy_accuracy"]
            row[f"{arm}_greedy"], row[f"{arm}_gain"], row[f"{arm}_s"] = after["greedy_accuracy"], gain, round(seconds, 1)
            if arm == "ppo":
                row["ppo_explained_variance_last"] = C.window_mean(history, "value/explained_variance", False, max(1, len(history) // 5))
            arms[arm]["gains"].append(gain)
            arms[arm]["_history"], arms[arm]["_cfg"], arms[arm]["heldout_after"] = history, cfg.model_copy(update={"rl": rl_cfg}), after
            print(f"seed {seed} {arm}: SFT {sft['greedy_accuracy']:.3f} -> {after['greedy_accuracy']:.3f} ({seconds:.0f}s)", flush=True)
        per_seed.append(row)
    text = C.print_table(f"\nPPO vs GRPO on arithmetic, {args.steps} steps, seeds {seeds}", per_seed)
    summary = {}
    for arm in ARMS:
        mean, low, high = interval(arms[arm]["gains"])
        summary[f"{arm}_gain"] = {"mean": mean, "ci95": [low, high], "verdict": verdict_positive(low, high)}
    diff = [p - g for p, g in zip(arms["ppo"]["gains"], arms["grpo"]["gains"])]
    mean, low, high = interval(diff)
    summary["ppo_minus_grpo"] = {"mean": mean, "ci95": [low, high], "verdict": verdict_match(low, high)}
    for key, s in summary.items():
        print(f"{key}: {s['mean']:+.4f} [{s['ci95'][0]:+.4f}, {s['ci95'][1]:+.4f}] {s['verdict']}", flush=True)
    runs = {}
    if cfg.tracking.enabled:
        for arm in ARMS:
            final = {"gain_mean": summary[f"{arm}_gain"]["mean"], **{f"heldout_{k}": v for k, v in arms[arm]["heldout_after"].items()}}
            runs[arm] = C.log_arm(arms[arm]["_cfg"], f"ppo_vs_grpo/{arm}", arms[arm]["_history"], final, per_seed, text)
    C.write_json(args, {
        "claim": "ppo_vs_grpo", "steps": args.steps, "seeds": seeds, "per_seed": per_seed, "summary": summary,
        "arms": {a: {"gains": arms[a]["gains"], "heldout_after_last_seed": arms[a]["heldout_after"]} for a in ARMS},
        "mlflow_runs": runs, "runtime_s": round(time.time() - t0, 1),
    })


def resolve_preset(cfg, arm: str) -> dict:
    """The rl keys preset `arm` sets (presets apply below explicit settings, so they are expanded here)."""
    from posttrain.objectives.presets import expand

    return {k: tuple(v) if k == "aux" else v for k, v in expand(arm, cfg.rl.model_dump()).items()}


if __name__ == "__main__":
    main()
