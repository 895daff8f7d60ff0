"""Claim (b), SIPO (self-instructing policy optimization): the contrastive self-teacher gives a non-zero learning signal in groups where
every rollout fails (GRPO's advantage is exactly 0 there), and so keeps improving where GRPO stalls.

Setting: 2-digit multiplication, where a small SFT model solves few problems and many groups all fail (at the
recorded budget, SFT on all 4,000 training problems for 3,000 steps, 17-23% held-out and 43-63% of groups).
The start model is SFT'd on solved examples plus the same examples behind SIPO's contrastive context
(`<ref>+<wrong>-...=<prompt>` -> `<ref>`), so the self-teacher can read the framing (the paper's model
reads natural-language framing; ours must be taught this format). Arms from that start: `grpo`, `sipo`.
Reported per arm: the share of all-fail groups, the share of those where SIPO's token advantage is
non-zero (and GRPO's), early/late training accuracy and held-out accuracy.

    .venv/bin/python experiments/sipo_vs_grpo.py [--steps N] [--json FILE] [--micro]
"""

from __future__ import annotations

import random
import time

import torch

import _common as C
from posttrain import resolve
import _distill as D
from posttrain.objectives import advantages
from posttrain.trainers import contexts
from posttrain.tasks import Example

ARMS = ("grpo", "sipo")


def hinted(examples: list[Example], seed: int) -> list[Example]:
    """Each example behind a contrastive context with 0-3 wrong answers, reference framed as correct."""
    rng = random.Random(seed)
    out = []
    for e in examples:
        wrong = [str(int(e.answer) + d) for d in rng.sample([-20, -10, -2, -1, 1, 2, 10, 20], rng.randint(0, 3))]
        out.append(Example(prompt=contexts.contrastive_contexts(e, wrong)[0], completion=e.completion, answer=e.answer))
    return out


def main() -> None:
    args = C.parse_args(__doc__.split("\n")[0], 200)
    t0 = time.time()
    cfg = C.load_config(args, ["task.operations=['*']", "rl.rewards=[{name: correctness}]"])  # correctness only: all-fail means A = 0
    task = C.build_task(cfg.task)  # (not C.sft_start: its plain SFT model is never used here)
    splits = task.splits(args.seed)
    train, held = splits["train"], splits["heldout"]
    plain = train[: cfg.sft.n_examples or None]
    path = D.sft_on(cfg, task, plain + hinted(plain, args.seed), args.seed, "sipo_sft", extra_chars=contexts.LABEL_CHARS)
    model, tok = C.load_pretrained(path)
    sft = C.evaluate(model, tok, task, held, cfg.eval, args.seed)[0]
    print(f"SFT (plain + contrastive-context) held-out greedy {sft['greedy_accuracy']:.4f}", flush=True)
    k = max(1, args.steps // 5)
    arms = {}
    for arm in ARMS:
        rl_cfg = resolve.updated(cfg.rl, "rl", **{"advantage": arm})
        counts = {"groups": 0, "all_fail": 0, "all_fail_sipo_nonzero": 0, "all_fail_grpo_nonzero": 0}

        def on_step(step, result, rl_cfg=rl_cfg, counts=counts):
            batch = result.batch
            ok = batch.rewards[:, batch.reward_names.index("correctness")]
            grpo = advantages.get("grpo")(batch, rl_cfg)
            if "contrast_logp_gap" in batch.extras:
                sipo = advantages.get("sipo")(batch, rl_cfg)
            else:
                sipo = None
            for g in torch.unique(batch.group):
                rows = batch.group == g
                counts["groups"] += 1
                if ok[rows].sum() == 0:
                    counts["all_fail"] += 1
                    counts["all_fail_grpo_nonzero"] += int(grpo[rows].abs().sum() > 0)
                    if sipo is not None:
                        counts["all_fail_sipo_nonzero"] += int(sipo[rows].abs().sum() > 1e-8)

        history, after, seconds = C.run_arm(cfg, rl_cfg, task, train, held, path, args.seed, on_step=on_step)
        arms[arm] = {"heldout_after": after, "rl_seconds": round(seconds, 1), "signal": counts, "_history": history, "_cfg": cfg.model_copy(update={"rl": rl_cfg})}
        print(f"{arm}: {seconds:.0f}s, held-out greedy {after['greedy_accuracy']:.4f}, {counts}", flush=True)
    rows = []
    for a in ARMS:
        c = arms[a]["signal"]
        rows.append({**D.summary_row(a, arms[a], k), "all_fail_share": c["all_fail"] / max(c["groups"], 1),
                     "all_fail_with_signal": (c["all_fail_sipo_nonzero"] if a == "sipo" else c["all_fail_grpo_nonzero"]) / max(c["all_fail"], 1)})
    text = C.print_table(f"\nSIPO vs GRPO on 2-digit multiplication, {args.steps} steps (first/last {k} steps)", rows)
    D.finish(args, cfg, "sipo_vs_grpo", arms, rows, text, {"sft_heldout": sft, "k": k}, t0)


if __name__ == "__main__":
    C.run_seeds(main, "sipo_vs_grpo")
