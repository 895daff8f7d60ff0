"""Claim (c): QGLAS (Quality-Gated Length Advantage Shaping) shortens quality-favoured responses without costing quality, where the same
quality reward alone leaves length free to drift.

Task: ranked differential diagnosis (tasks/diagnosis.py). Quality: the `kgpo` reward (RareDx-KGPO, saturating
aggregation), under which the gold disease at rank 1 scores 1 whether or not relatives follow it, so length
is not what quality pays for. The SFT references list the gold plus 0..K-1 relatives, so the start policy
writes differentials of varied length. Arms: `grpo` on kgpo (quality-only) and `qglas` on kgpo.
Reported: held-out Hit@1 (greedy accuracy), mean greedy list length (items), mean sampled completion length
(tokens) over the first and last training windows, and kgpo reward during training.

    .venv/bin/python experiments/qglas_vs_quality.py [--steps N] [--json FILE] [--tracking-uri URI] [--micro]
"""

from __future__ import annotations

import time

import _common as C
from posttrain import resolve

TASK = ["task.name=diagnosis", "task.n_train=1200", "task.n_heldout=300", "rl.rewards=[{name: kgpo, weight: 1.0}]",
        "rl.max_new_tokens=12", "eval.max_new_tokens=12", "eval.n_prompts=300", "eval.batch_size=300"]
MICRO_TASK = ["task.n_train=100", "task.n_heldout=20", "eval.n_prompts=20", "eval.batch_size=20"]
ARMS = {"quality_only": {"advantage": "grpo"}, "qglas": {"advantage": "qglas"}}


def main() -> None:
    args = C.parse_args(__doc__.split("\n")[0], 300)
    t0 = time.time()
    cfg = C.load_config(args, TASK + (MICRO_TASK if args.micro else []))
    task, train, held, path, sft = C.sft_start(cfg, args.seed)
    print(f"SFT start: Hit@1 {sft['greedy_accuracy']:.4f}, list length {sft['greedy_list_length']:.3f}", flush=True)
    k = max(1, min(50, args.steps // 5))
    arms = {}
    for arm, update in ARMS.items():
        rl_cfg = resolve.updated(cfg.rl, "rl", **update)
        history, after, seconds = C.run_arm(cfg, rl_cfg, task, train, held, path, args.seed)
        arms[arm] = {
            "heldout_before": sft, "heldout_after": after, "rl_seconds": round(seconds, 1),
            "completion_tokens_first_k": C.window_mean(history, "completion_length", True, k),
            "completion_tokens_last_k": C.window_mean(history, "completion_length", False, k),
            "kgpo_first_k": C.window_mean(history, "reward/kgpo_mean", True, k),
            "kgpo_last_k": C.window_mean(history, "reward/kgpo_mean", False, k),
            "completion_tokens_curve": C.curve(history, "completion_length"),
            "_history": history, "_cfg": cfg.model_copy(update={"rl": rl_cfg}),
        }
        print(f"{arm}: {seconds:.0f}s, Hit@1 {after['greedy_accuracy']:.4f}, list length {after['greedy_list_length']:.3f}", flush=True)
    rows = [{"arm": a, "hit1_before": sft["greedy_accuracy"], "hit1_after": arms[a]["heldout_after"]["greedy_accuracy"],
             "items_before": sft["greedy_list_length"], "items_after": arms[a]["heldout_after"]["greedy_list_length"],
             "tokens_first": arms[a]["completion_tokens_first_k"], "tokens_last": arms[a]["completion_tokens_last_k"],
             "kgpo_first": arms[a]["kgpo_first_k"], "kgpo_last": arms[a]["kgpo_last_k"]} for a in ARMS]
    text = C.print_table(f"\nqglas vs quality-only (kgpo), {args.steps} steps (training windows: first/last {k} steps)", rows)
    runs = {}
    if cfg.tracking.enabled:
        for a in ARMS:
            final = {**{f"heldout_{m}": v for m, v in arms[a]["heldout_after"].items()},
                     "completion_tokens_last_k": arms[a]["completion_tokens_last_k"]}
            runs[a] = C.log_arm(arms[a]["_cfg"], f"qglas_vs_quality/{a}", arms[a]["_history"], final, rows, text)
    for a in ARMS:
        arms[a].pop("_history"), arms[a].pop("_cfg")
    results = {"claim": "qglas_vs_quality", "steps": args.steps, "k": k, "sft_heldout": sft, "arms": arms, "table": rows,
               "mlflow_runs": runs, "runtime_s": round(time.time() - t0, 1)}
    print(f"runtime {results['runtime_s']}s")
    C.write_json(args, results)


if __name__ == "__main__":
    C.run_seeds(main, "qglas_vs_quality")
