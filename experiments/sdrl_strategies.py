"""Claim (SDRL, strategy-diverse RL): the correctness-gated strategy-diversity reward keeps several correct strategies
alive where correctness-only RL collapses onto one, without costing success.

Task: small optimisation instances (tasks/optimisation.py: knapsack and assignment); a completion names a strategy
(d exact, g greedy, r random search) and gives a solution that the verifier checks against the optimum. The SFT
start imitates all three strategies (each reference is what its strategy computes on the instance), so the
policy starts mixed, and the strategies differ in how often they are right. Arms from the same start and seed:
`correctness` (GRPO on the verifier) and `sdrl` (GRPO on c (1 + beta_b D_b + beta_w D_w), strategies read from the
completion's first character; the verifier column rides along at weight 0).
Reported on held-out instances, `--samples` samples each at temperature 1: success rate, the mean number of
distinct strategies among a prompt's correct samples, the entropy (bits) of the strategy mix of all samples and
each strategy's share; for the sdrl arm, the mean diversity bonus per rollout during training.

    .venv/bin/python experiments/sdrl_strategies.py [--steps N] [--samples M] [--json FILE] [--micro]
"""

from __future__ import annotations

import math
import time
from collections import Counter

import torch

import _common as C
from posttrain import resolve
from posttrain.config import RewardSpec
from posttrain.models import load_pretrained
from posttrain.rollout.sampling import generate
from posttrain.tasks.optimisation import STRATEGIES

TASK = ["task.name=optimisation", "task.n_train=800", "task.n_heldout=100", "sft.steps=600", "sft.n_examples=0",
        "rl.max_new_tokens=8", "eval.max_new_tokens=8", "eval.n_prompts=100", "eval.batch_size=100"]
MICRO_TASK = ["task.n_train=60", "task.n_heldout=10", "eval.n_prompts=10", "eval.batch_size=10", "sft.steps=10"]
STRATEGY_PATTERNS = {"exact": ("^d:",), "greedy": ("^g:",), "search": ("^r:",)}
ARMS = ("correctness", "sdrl")


@torch.no_grad()
def strategy_use(model, tok, task, held, samples: int, seed: int) -> dict[str, float]:
    model.eval()
    out, texts = generate(model, tok, [e.prompt for e in held], 8, group_size=samples, generator=torch.Generator().manual_seed(seed))
    finished = out.finished.tolist()
    distinct, used, correct_total = [], Counter(), 0
    for i, example in enumerate(held):
        rows = range(i * samples, (i + 1) * samples)
        correct = [task.strategy(texts[j]) for j in rows if finished[j] and task.correctness_reward(texts[j], True, example)]
        correct_total += len(correct)
        distinct.append(len(set(correct)))
        used.update(task.strategy(texts[j]) if finished[j] else None for j in rows)
    n = len(held) * samples
    shares = {s: used[s] / n for s in STRATEGIES}
    entropy = -sum(p * math.log2(p) for p in shares.values() if p > 0)
    return {"heldout_success": correct_total / n, "distinct_strategies": sum(distinct) / len(held), "strategy_entropy": entropy,
            **{f"share_{s}": v for s, v in shares.items()}, "malformed_share": used[None] / n}


def main() -> None:
    args = C.parse_args(__doc__.split("\n")[0], 100, [("--samples", int, 16, "samples per held-out prompt")])
    t0 = time.time()
    cfg = C.load_config(args, TASK + (MICRO_TASK if args.micro else []))
    task, train, held, path, sft = C.sft_start(cfg, args.seed)
    model, tok = load_pretrained(path)
    before = strategy_use(model, tok, task, held, args.samples, args.seed)
    print(f"SFT start: {before}", flush=True)
    sdrl_block = {**cfg.rl.options_for("sdrl").model_dump(), "strategies": STRATEGY_PATTERNS, "fallback": "other"}
    settings = {
        "correctness": {"rewards": (RewardSpec(name="correctness", weight=1.0),)},
        "sdrl": {"rewards": (RewardSpec(name="sdrl", weight=1.0), RewardSpec(name="correctness", weight=0.0)), "options": {"sdrl": sdrl_block}},
    }
    k = max(1, args.steps // 5)
    arms = {}
    for arm in ARMS:
        rl_cfg = resolve.updated(cfg.rl, "rl", **settings[arm])
        measured = lambda m, t: strategy_use(m, t, task, held, args.samples, args.seed)  # noqa: E731
        history, after, seconds = C.run_arm(cfg, rl_cfg, task, train, held, path, args.seed, evaluate_fn=measured)
        bonus = [h["reward/sdrl_mean"] - h["reward/correctness_mean"] for h in history if "reward/sdrl_mean" in h]
        arms[arm] = {"before": before, "after": after, "rl_seconds": round(seconds, 1), "bonus_mean": sum(bonus) / len(bonus) if bonus else 0.0,
                     "bonus_steps": len(bonus),
                     "train_accuracy_first": C.window_mean(history, "accuracy", True, k), "train_accuracy_last": C.window_mean(history, "accuracy", False, k),
                     "_history": history, "_cfg": cfg.model_copy(update={"rl": rl_cfg})}
        print(f"{arm}: {seconds:.0f}s, {after}, bonus {arms[arm]['bonus_mean']:.4f}", flush=True)
    rows = [{"arm": "sft (before)", **before, "bonus_mean": float("nan")}] + [{"arm": a, **arms[a]["after"], "bonus_mean": arms[a]["bonus_mean"]} for a in ARMS]
    text = C.print_table(f"\nSDRL vs correctness-only on optimisation instances, {args.steps} steps, {len(held)} held-out x {args.samples} samples", rows)
    runs = {}
    if cfg.tracking.enabled:
        for a in ARMS:
            runs[a] = C.log_arm(arms[a]["_cfg"], f"sdrl_strategies/{a}", arms[a]["_history"], {**arms[a]["after"], "bonus_mean": arms[a]["bonus_mean"]}, rows, text)
    for a in ARMS:
        arms[a].pop("_history"), arms[a].pop("_cfg")
    results = {"claim": "sdrl_strategies", "steps": args.steps, "samples": args.samples, "sft_heldout": sft, "arms": arms, "table": rows,
               "mlflow_runs": runs, "runtime_s": round(time.time() - t0, 1)}
    print(f"runtime {results['runtime_s']}s")
    C.write_json(args, results)


if __name__ == "__main__":
    C.run_seeds(main, "sdrl_strategies")
