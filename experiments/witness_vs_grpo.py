"""Claim (b): on distribution matching, the `witness` advantage (the MMD witness of the group's outcome counts) moves the policy's sampling
distribution towards the stated target q, where group-scored GRPO (reward: the sample lies in q's support)
has no reason to: any in-support outcome is equally good to it, so it drifts towards whatever it already
prefers. Metric: total-variation distance TV(p_hat, q) per held-out prompt, p_hat from `--samples` samples
at temperature 1, averaged over prompts; before RL (the SFT start) and after each arm.

Three arms: `grpo`, `witness_reward` (the witness as GRPO reward) and `witness_raw` (the witness as the advantage);
all start from the same SFT checkpoint with the same seed. The SFT model sees one sample of q per
training prompt, so it starts far from q on purpose (it imitates single draws, not distributions).

    .venv/bin/python experiments/witness_vs_grpo.py [--steps N] [--samples M] [--json FILE] [--tracking-uri URI] [--micro]
"""

from __future__ import annotations

import time

import torch

import _common as C
from posttrain import resolve
from posttrain.models import load_pretrained
from posttrain.rollout.sampling import generate
from posttrain.tasks.distribution import total_variation

TASK = ["task.name=distribution", "task.digits=3", "task.n_train=200", "task.n_heldout=60",
        "rl.max_new_tokens=2", "eval.max_new_tokens=2", "eval.n_prompts=60", "eval.batch_size=60"]
MICRO_TASK = ["task.n_train=40", "task.n_heldout=10", "eval.n_prompts=10", "eval.batch_size=10"]
# witness_reward: the witness as the GRPO reward, group-normalised (rl.options.witness.as_reward true); a group whose
# rollouts share one outcome then gets 0. witness_raw: the witness itself is the advantage (as_reward false), which
# gives that group q_k - 1 < 0. The comparison of the two chose params.yaml's default (docs/claims.md).
ARMS = {"grpo": {"advantage": "grpo"}, "witness_reward": {"advantage": "witness", "as_reward": True},
        "witness_raw": {"advantage": "witness", "as_reward": False}}


@torch.no_grad()
def heldout_tv(model, tok, task, held, samples: int, seed: int) -> dict[str, float]:
    """Mean and median TV(p_hat, q) over held-out prompts, and the share of invalid samples."""
    model.eval()
    out, texts = generate(model, tok, [e.prompt for e in held], 2, group_size=samples, generator=torch.Generator().manual_seed(seed))
    finished = out.finished.tolist()
    tvs, invalid = [], 0
    for i, example in enumerate(held):
        rows = range(i * samples, (i + 1) * samples)
        outcomes = [task.outcome(texts[j]) if finished[j] else None for j in rows]
        invalid += sum(o is None for o in outcomes)
        tvs.append(total_variation(outcomes, task.target(example)))
    tvs_sorted = sorted(tvs)
    return {"tv_mean": sum(tvs) / len(tvs), "tv_median": tvs_sorted[len(tvs) // 2], "invalid_share": invalid / (len(held) * samples)}


def main() -> None:
    args = C.parse_args(__doc__.split("\n")[0], 300, [("--samples", int, 64, "samples per held-out prompt for p_hat")])
    t0 = time.time()
    cfg = C.load_config(args, TASK + (MICRO_TASK if args.micro else []) + ["rl.rewards=[{name: correctness, weight: 1.0}]"])
    task, train, held, path, sft = C.sft_start(cfg, args.seed)
    model, tok = load_pretrained(path)
    before = heldout_tv(model, tok, task, held, args.samples, args.seed)
    print(f"SFT start: TV mean {before['tv_mean']:.4f}, in-support greedy {sft['greedy_accuracy']:.4f}", flush=True)
    arms = {}
    for arm, update in ARMS.items():
        update = dict(update)
        if "as_reward" in update:
            update["options"] = {"witness": {**cfg.rl.options_for("witness").model_dump(), "as_reward": update.pop("as_reward")}}
        rl_cfg = resolve.updated(cfg.rl, "rl", **update)
        measured = lambda m, t: {**C.evaluate(m, t, task, held, cfg.eval, args.seed)[0], "tv": heldout_tv(m, t, task, held, args.samples, args.seed)}  # noqa: E731
        history, after, seconds = C.run_arm(cfg, rl_cfg, task, train, held, path, args.seed, evaluate_fn=measured)
        tv = after.pop("tv")
        arms[arm] = {"tv_before": before, "tv_after": tv, "heldout_after": after, "rl_seconds": round(seconds, 1),
                     "_history": history, "_cfg": cfg.model_copy(update={"rl": rl_cfg})}
        print(f"{arm}: {seconds:.0f}s, TV mean {before['tv_mean']:.4f} -> {tv['tv_mean']:.4f}", flush=True)
    rows = [{"arm": a, "tv_before": before["tv_mean"], "tv_after": arms[a]["tv_after"]["tv_mean"],
             "tv_median_after": arms[a]["tv_after"]["tv_median"], "invalid_after": arms[a]["tv_after"]["invalid_share"],
             "in_support_greedy_after": arms[a]["heldout_after"]["greedy_accuracy"]} for a in ARMS]
    text = C.print_table(f"\nwitness vs grpo (support reward), {args.steps} steps, TV over {len(held)} held-out prompts x {args.samples} samples", rows)
    runs = {}
    if cfg.tracking.enabled:
        for a in ARMS:
            final = {"tv_before": before["tv_mean"], **{f"{k}_after": v for k, v in arms[a]["tv_after"].items()},
                     **{f"heldout_{m}": v for m, v in arms[a]["heldout_after"].items()}}
            runs[a] = C.log_arm(arms[a]["_cfg"], f"witness_vs_grpo/{a}", arms[a]["_history"], final, rows, text)
    for a in ARMS:
        arms[a].pop("_history"), arms[a].pop("_cfg")
    results = {"claim": "witness_vs_grpo", "steps": args.steps, "samples": args.samples, "sft_heldout": sft, "arms": arms,
               "table": rows, "mlflow_runs": runs, "runtime_s": round(time.time() - t0, 1)}
    print(f"runtime {results['runtime_s']}s")
    C.write_json(args, results)


if __name__ == "__main__":
    C.run_seeds(main, "witness_vs_grpo")
