"""Claim (a): GDPO (normalise each reward per group, then sum) keeps distinct reward combinations apart where
sum_then_normalize (GRPO on the weighted sum) merges them, and so teaches each reward better.

Rewards: correctness + a second reward (--second): `format` (registered; saturated at ~0.99 after SFT, so the
two columns rarely disagree) or `even_answer` (defined here only: 1 when the answer parses to an even integer;
independent of correctness, so (correct, odd) and (wrong, even) share a group whenever the answer is odd).
Equal weights by default (--second-weight): the setting in which sum-then-normalise maps (1, 0) and (0, 1) to
the same advantage.
Both arms start from the same SFT checkpoint with the same seed. On every rollout batch of both arms both
estimators are applied to the *identical* batch and the distinct advantage values per group are counted.

    .venv/bin/python experiments/gdpo_vs_sum.py [--steps N] [--json FILE] [--tracking-uri URI] [--micro]
"""

from __future__ import annotations

import time

import torch

import _common as C
from posttrain import resolve
from posttrain.objectives import advantages
from posttrain.rewards import rewards as reward_registry


@reward_registry.register("even_answer")
def even_answer(task, examples, completions, finished) -> torch.Tensor:
    """1 when the completion parses to an even integer (a second verifiable reward, experiment-only)."""
    parsed = [task.parse(c) for c in completions]
    return torch.tensor([float(p is not None and p.lstrip("-").isdigit() and int(p) % 2 == 0) for p in parsed])

ARMS = ("sum_then_normalize", "gdpo")


def distinct_per_group(values: torch.Tensor, group: torch.Tensor) -> list[int]:
    """Number of distinct values (rows of `values`, rounded to 1e-5) in each group."""
    values = torch.round(values.reshape(len(group), -1) * 1e5)
    return [len({tuple(r) for r in values[group == g].tolist()}) for g in torch.unique(group).tolist()]


def main() -> None:
    p_args = C.parse_args(__doc__.split("\n")[0], 500, [("--second", str, "format", "second reward: format | even_answer"),
                                                        ("--second-weight", float, 1.0, "weight of the second reward")])
    fw, second = p_args.second_weight, p_args.second
    rewards = f"rl.rewards=[{{name: correctness, weight: 1.0}}, {{name: {second}, weight: {fw}}}]"
    t0 = time.time()
    cfg = C.load_config(p_args, [rewards])
    task, train, held, path, sft = C.sft_start(cfg, p_args.seed)
    print(f"SFT held-out: greedy {sft['greedy_accuracy']:.4f} sampled {sft['sampled_accuracy']:.4f} format {sft['sampled_format_rate']:.4f}", flush=True)
    k = max(1, min(50, p_args.steps // 5))
    counts = {a: [] for a in ARMS}  # distinct advantage values per group, both estimators on the same batches
    combos, merged = [], {a: 0 for a in ARMS}  # distinct reward combinations per group; groups where A merges them
    arms = {}
    for arm in ARMS:
        rl_cfg = resolve.updated(cfg.rl, "rl", **{"advantage": arm})

        def on_step(step, result):
            batch = result.batch
            c = distinct_per_group(batch.rewards, batch.group)
            combos.extend(c)
            for est in ARMS:
                d = distinct_per_group(advantages.get(est)(batch, rl_cfg), batch.group)  # noqa: B023  (called during this arm's run)
                counts[est].extend(d)
                merged[est] += sum(di < ci for di, ci in zip(d, c))

        history, after, seconds = C.run_arm(cfg, rl_cfg, task, train, held, path, p_args.seed, on_step)
        arms[arm] = {
            "history_accuracy_curve": C.curve(history, "accuracy"),
            "rl_seconds": round(seconds, 1),
            "heldout_before": sft,
            "heldout_after": after,
            "reward_first_k": {r: C.window_mean(history, f"reward/{r}_mean", True, k) for r in ("correctness", second)},
            "reward_last_k": {r: C.window_mean(history, f"reward/{r}_mean", False, k) for r in ("correctness", second)},
            "adv_share_mean": {r: C.window_mean(history, f"reward/{r}_adv_share", True, len(history)) for r in ("correctness", second)},
            "_history": history, "_cfg": cfg.model_copy(update={"rl": rl_cfg}),
        }
        a = arms[arm]
        a["reward_delta"] = {r: a["reward_last_k"][r] - a["reward_first_k"][r] for r in a["reward_first_k"]}
        print(f"{arm}: {seconds:.0f}s, held-out greedy {after['greedy_accuracy']:.4f}", flush=True)

    n_groups = len(combos)
    distinct = {
        "n_groups": n_groups,
        "mean_distinct_reward_combos": sum(combos) / n_groups,
        **{f"mean_distinct_adv_{e}": sum(counts[e]) / n_groups for e in ARMS},
        **{f"frac_groups_merging_combos_{e}": merged[e] / n_groups for e in ARMS},
        "frac_groups_with_2plus_combos": sum(c >= 2 for c in combos) / n_groups,
    }
    dist_rows = [{"estimator": e, "groups": n_groups, "mean_distinct_combos": distinct["mean_distinct_reward_combos"],
                  "mean_distinct_adv": distinct[f"mean_distinct_adv_{e}"], "frac_groups_merged": distinct[f"frac_groups_merging_combos_{e}"]} for e in ARMS]
    rows = [{"arm": a, "d_correctness": arms[a]["reward_delta"]["correctness"], f"d_{second}": arms[a]["reward_delta"][second],
             "last_correct": arms[a]["reward_last_k"]["correctness"], f"last_{second}": arms[a]["reward_last_k"][second],
             "heldout_greedy_before": sft["greedy_accuracy"], "heldout_greedy_after": arms[a]["heldout_after"]["greedy_accuracy"],
             "heldout_sampled_after": arms[a]["heldout_after"]["sampled_accuracy"],
             "heldout_format_after": arms[a]["heldout_after"]["sampled_format_rate"]} for a in ARMS]
    text = C.print_table(f"\n(1) distinct advantage values per group, both estimators on the same {n_groups} groups", dist_rows)
    text += "\n" + C.print_table(f"\n(2) reward improvement (mean of last {k} steps - first {k}), held-out accuracy", rows)
    runs = {}
    if cfg.tracking.enabled:
        for a in ARMS:
            final = {**{f"delta_{r}": v for r, v in arms[a]["reward_delta"].items()}, **{f"heldout_{m}": v for m, v in arms[a]["heldout_after"].items()},
                     **{k2: v for k2, v in distinct.items()}}
            runs[a] = C.log_arm(arms[a]["_cfg"], f"gdpo_vs_sum/{second}/{a}", arms[a]["_history"], final, rows, text)
    for a in ARMS:
        arms[a].pop("_history"), arms[a].pop("_cfg")
    results = {
        "claim": "gdpo_vs_sum", "steps": p_args.steps, "k": k, "second_reward": second, "second_weight": fw, "sft_heldout": sft,
        "distinct": distinct, "arms": arms, "table": rows, "distinct_table": dist_rows, "mlflow_runs": runs,
        "runtime_s": round(time.time() - t0, 1),
    }
    print(f"runtime {results['runtime_s']}s")
    C.write_json(p_args, results)


if __name__ == "__main__":
    C.run_seeds(main, "gdpo_vs_sum")
