"""Claim (TRM + PD-GRPO): training a Thinking Reward Model with PD-GRPO keeps its pointwise scores graded, where plain
pairwise training (paying the score margin over the other candidate) polarises them: winners to the top of the
scale, losers to the bottom.

One format SFT warm-up of the TRM (from the SFT policy, on `reward_model.data` pairs) is shared by both arms; each
arm then runs the same number of pairwise RL steps from it, `pd_grpo` vs `pairwise_margin` (the only difference).
Reported on held-out pairs, greedy judgements: pair accuracy, ties, the std of the scores, the share at either end
of the scale, the score histogram of preferred and rejected candidates.

    .venv/bin/python experiments/trm_anti_polarisation.py [--steps N] [--json FILE] [--micro] [--set reward_model.steps=...]
"""

from __future__ import annotations

import json
import time

import _common as C
from posttrain import resolve
from posttrain.data.preferences import read_pairs, write_pairs
from posttrain.models import load_pretrained
from posttrain.rewards.trm import judge
from posttrain.stages.preference import load_pairs
from posttrain.trainers.trm import pair_metrics, pairwise_rl, save_trm, warm_up

ARMS = ("pd_grpo", "pairwise_margin")


def with_trm(cfg, **options):
    rm = resolve.updated(cfg.reward_model, "reward_model", kind="trm", options={"trm": options})
    return cfg.model_copy(update={"reward_model": rm})


def pairs_and_warm_start(cfg, task, train, held, sft_path, seed: int):
    """(train pairs, held-out pairs, directory of the warmed-up TRM), built once per config."""
    out = C.CACHE / f"trm_warm_{cfg.section_hash('task', 'model', 'sft', 'reward_model')}_s{seed}"
    if not (out / "done").exists():
        model, tokenizer = load_pretrained(sft_path)
        train_pairs, held_pairs = load_pairs(cfg, cfg.reward_model, task, train, held, (model, tokenizer))
        out.mkdir(parents=True, exist_ok=True)
        write_pairs(out / "train.jsonl", train_pairs)
        write_pairs(out / "heldout.jsonl", held_pairs)
        trm, trm_tokenizer = warm_up(cfg, sft_path, train_pairs, held_pairs, seed, on_log=lambda s, m: None)
        save_trm(trm, trm_tokenizer, out / "model", cfg)
        (out / "done").write_text("ok")
    return read_pairs(out / "train.jsonl"), read_pairs(out / "heldout.jsonl"), out / "model"


def distribution(model, tokenizer, pairs, score_max: int, max_new_tokens: int) -> dict:
    """Held-out score histograms (integer bins 0..score_max) of the preferred and of the rejected candidates."""
    prompts = [p.prompt for p in pairs for _ in range(2)]
    scores, valid, _ = judge(model, tokenizer, prompts, [t for p in pairs for t in (p.chosen, p.rejected)], score_max, max_new_tokens)
    out = {}
    for side, rows in (("chosen", slice(0, None, 2)), ("rejected", slice(1, None, 2))):
        s = scores[rows][valid[rows]].round().long()
        out[f"{side}_histogram"] = [int((s == k).sum()) for k in range(score_max + 1)]
        out[f"{side}_mean"] = round(float(s.float().mean()), 4) if s.numel() else None
        out[f"{side}_std"] = round(float(s.float().std()), 4) if s.numel() > 1 else None
    return out


def main() -> None:
    args = C.parse_args(__doc__.split("\n")[0], 60)
    t0 = time.time()
    cfg = with_trm(C.load_config(args, []), rl_steps=args.steps)
    opts = cfg.reward_model.options_for("trm")
    task, train, held, sft_path, sft = C.sft_start(cfg, args.seed)
    train_pairs, held_pairs, warm_dir = pairs_and_warm_start(cfg, task, train, held, sft_path, args.seed)
    model, tokenizer = load_pretrained(warm_dir)
    warm = {**pair_metrics(model, tokenizer, held_pairs, opts.score_max, opts.max_new_tokens),
            **distribution(model, tokenizer, held_pairs, opts.score_max, opts.max_new_tokens)}
    print(f"warm-up ({cfg.reward_model.steps} SFT steps): {json.dumps(warm)}", flush=True)
    arms, rows = {"warmup": warm}, []
    for arm in ARMS:
        arm_cfg = with_trm(cfg, pairwise_reward=arm)
        model, tokenizer = load_pretrained(warm_dir)
        history: list[dict] = []
        start = time.time()
        pairwise_rl(arm_cfg, model, tokenizer, train_pairs, held_pairs, args.seed, on_log=lambda s, m: history.append(m))  # noqa: B023  (runs within this arm)
        final = {**pair_metrics(model, tokenizer, held_pairs, opts.score_max, opts.max_new_tokens),
                 **distribution(model, tokenizer, held_pairs, opts.score_max, opts.max_new_tokens), "rl_seconds": round(time.time() - start, 1)}
        arms[arm] = {**final, "history": history, "_cfg": arm_cfg}
        print(f"{arm}: {json.dumps({k: v for k, v in final.items()})}", flush=True)
    for name, a in arms.items():
        rows.append({"arm": name, "pair_accuracy": a["heldout_pair_accuracy"], "ties": a["heldout_pair_ties"], "score_std": a["score_std"],
                     "extreme_fraction": a["score_extreme_fraction"], "parse_rate": a["parse_rate"],
                     "chosen_mean": a["chosen_mean"] or 0.0, "rejected_mean": a["rejected_mean"] or 0.0})
    text = C.print_table(f"\nTRM held-out judgements after the warm-up and after {args.steps} pairwise RL steps "
                         f"({len(held_pairs)} pairs, scores 0..{opts.score_max})", rows)
    runs = {}
    if cfg.tracking.enabled:
        for arm in ARMS:
            a = arms[arm]
            final = {k: v for k, v in a.items() if isinstance(v, (int, float))}
            runs[arm] = C.log_arm(a["_cfg"], f"trm_anti_polarisation/{arm}", a["history"], final, rows, text)
    for arm in ARMS:
        arms[arm].pop("_cfg")
    results = {"claim": "trm_anti_polarisation", "steps": args.steps, "warmup_steps": cfg.reward_model.steps, "sft_heldout": sft,
               "n_pairs": len(train_pairs), "n_heldout_pairs": len(held_pairs), "arms": arms, "table": rows, "mlflow_runs": runs,
               "runtime_s": round(time.time() - t0, 1)}
    print(f"runtime {results['runtime_s']}s")
    C.write_json(args, results)


if __name__ == "__main__":
    C.run_seeds(main, "trm_anti_polarisation")
