"""Claim: with abundant biased pseudo labels and a small gold subset, ABC-Align (pseudo-label DPO + an adaptively
weighted correction on the gold subset) beats pseudo-label-only DPO, gold-only DPO and the prediction-powered (PPI)
correction with its full weight (alpha = 1, unbiased but high-variance with few gold labels) on held-out preference
accuracy against the truth.

Pairs: task-derived arithmetic pairs (reference answer vs a corrupted one). The pseudo labeller is biased: on
near-miss pairs it prefers the answer with the larger last digit, right or wrong (a systematic error on about
half of the minor tier, none elsewhere). The gold subset (`--gold` pairs, drawn uniformly from the pool) carries
human labels that are right except for `--gold-noise` random flips. All arms start from the same SFT
checkpoint, with the same steps, lr and beta; held-out pairs are in their true order. `ppi` is the same objective and
data as `abc_align` with alpha fixed at 1 (`preference.options.abc_align.fixed_alpha=1`) instead of its plug-in choice.

    .venv/bin/python experiments/abc_align_pseudo_labels.py [--steps N] [--gold N] [--json FILE] [--micro]
"""

from __future__ import annotations

import random
import time
from dataclasses import replace

import _common as C
from posttrain import resolve
from posttrain.data.preferences import PreferencePair, preference_data
from posttrain.models import load_pretrained
from posttrain.runtime import seed_everything
from posttrain.trainers.preference import train_preference

ARMS = ("pseudo_only", "gold_only", "abc_align", "ppi")


def pseudo_label(pair: PreferencePair) -> PreferencePair:
    """The biased labeller's order: on a near miss (same length, last digit differs) the larger last digit wins."""
    near_miss = len(pair.chosen) == len(pair.rejected) and pair.chosen[:-1] == pair.rejected[:-1]
    flipped = near_miss and pair.rejected[-1] > pair.chosen[-1]
    return replace(pair, chosen=pair.rejected, rejected=pair.chosen) if flipped else pair


def main() -> None:
    args = C.parse_args(__doc__.split("\n")[0], 150, [("--pool", int, 3000, "pseudo-labelled pairs"), ("--gold", int, 60, "gold-labelled pairs"),
                                                      ("--gold-noise", float, 0.1, "share of flipped gold labels")])
    t0 = time.time()
    cfg = C.load_config(args, [f"preference.steps={args.steps}"])
    task, train, held, path, sft = C.sft_start(cfg, args.seed)
    rng = random.Random(args.seed)
    build = preference_data.get("task_pairs")
    truth = build(task, train, args.pool if not args.micro else 60, args.seed)
    held_pairs = build(task, held, cfg.preference.n_heldout_pairs if not args.micro else 20, args.seed + 1)
    pseudo = [pseudo_label(p) for p in truth]
    gold_ids = set(rng.sample(range(len(truth)), min(args.gold, len(truth))))
    human_right = {i: rng.random() >= args.gold_noise for i in gold_ids}
    # gold flag: does the human agree with the pseudo order? (the truth order, unless this human label is a flip)
    pool = [replace(p, gold=((p.chosen == t.chosen) == human_right[i]) if i in gold_ids else None) for i, (p, t) in enumerate(zip(pseudo, truth))]
    gold_only = [replace(t if human_right[i] else replace(t, chosen=t.rejected, rejected=t.chosen), gold=None) for i, t in enumerate(truth) if i in gold_ids]
    data = {"pseudo_only": ([replace(p, gold=None) for p in pool], "dpo"), "gold_only": (gold_only, "dpo"), "abc_align": (pool, "abc_align"),
            "ppi": (pool, "abc_align")}
    fixed = {"ppi": {"abc_align": {"fixed_alpha": 1.0}}}  # PPI: the correction at full strength, never adapted
    wrong = sum(p.chosen != t.chosen for p, t in zip(pseudo, truth)) / len(truth)
    print(f"pseudo-label error rate {wrong:.3f}; gold pairs {len(gold_only)}", flush=True)
    arms, rows = {}, []
    for arm in ARMS:
        pairs, objective = data[arm]
        model, tokenizer = load_pretrained(path)
        seed_everything(args.seed)
        pref = resolve.updated(cfg.preference, "preference", objective=objective, **({"options": fixed[arm]} if arm in fixed else {}))
        start = time.time()
        history, metrics = train_preference(model, tokenizer, pairs, held_pairs, pref, args.seed, on_log=lambda s, m: None)
        after, _ = C.evaluate(model, tokenizer, task, held, cfg.eval, args.seed)
        alpha = [h["abc/alpha"] for h in history if "abc/alpha" in h]
        arms[arm] = {"pairs": metrics, "heldout_after": after, "alpha_curve": alpha, "seconds": round(time.time() - start, 1),
                     "_history": history, "_cfg": cfg.model_copy(update={"preference": pref})}
        rows.append({"arm": arm, "train_pairs": len(pairs), "heldout_pair_acc": metrics["heldout_pair_accuracy"],
                     "heldout_logp_pair_acc": metrics["heldout_logp_pair_accuracy"], "greedy_acc_before": sft["greedy_accuracy"],
                     "greedy_acc_after": after["greedy_accuracy"], "final_alpha": alpha[-1] if alpha else float("nan")})
        print(f"{arm}: {arms[arm]['seconds']:.0f}s, held-out pair accuracy {metrics['heldout_pair_accuracy']:.4f}", flush=True)
    text = C.print_table(f"\nABC-Align vs pseudo-only vs gold-only vs PPI (alpha = 1) (pseudo error {wrong:.3f}, {len(gold_only)} gold pairs, {args.steps} steps)", rows)
    runs = {}
    if cfg.tracking.enabled:
        for arm, a in arms.items():
            final = {f"pairs_{k}": v for k, v in a["pairs"].items()} | {f"heldout_{k}": v for k, v in a["heldout_after"].items()}
            runs[arm] = C.log_arm(a["_cfg"], f"abc_align/{arm}", a["_history"], final, rows, text)
    for a in arms.values():
        a.pop("_history"), a.pop("_cfg")
    results = {"claim": "abc_align_pseudo_labels", "steps": args.steps, "pseudo_error_rate": wrong, "n_gold": len(gold_only), "arms": arms,
               "table": rows, "mlflow_runs": runs, "runtime_s": round(time.time() - t0, 1)}
    print(f"runtime {results['runtime_s']}s")
    C.write_json(args, results)


if __name__ == "__main__":
    C.run_seeds(main, "abc_align_pseudo_labels")
