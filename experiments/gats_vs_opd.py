"""Claim (a), GATS (Gap-Adaptive Teacher Scheduling): with a teacher weaker than the final student, gap-adaptive OPD gets the early
boost of distillation without the late drag of a constant OPD weight.

Teacher: the SFT model after `--teacher-steps` GRPO updates (0: the SFT model itself). Student start: the
same SFT model, or with `--student-sft-steps N` a weaker one trained N SFT steps on the same examples, so
that the teacher is ahead early and behind a fully trained student. Three arms, same seed and budget:
  grpo      reward-only GRPO
  opd_const GRPO + constant-weight OPD (rl.options.opd: weight w, reward_weight 1)
  gats      GRPO + w(gap) OPD, w -> 0 as the student's success EMA reaches the teacher's
Reported: early training success (mean over the first k steps), late training success, held-out accuracy.

    .venv/bin/python experiments/gats_vs_opd.py [--steps N] [--teacher-steps M] [--json FILE] [--micro]
"""

from __future__ import annotations

import time

import _common as C
from posttrain import resolve
import _distill as D

ARMS = ("grpo", "opd_const", "gats")


def main() -> None:
    args = C.parse_args(__doc__.split("\n")[0], 200, [("--teacher-steps", int, 40, "GRPO steps that make the teacher"),
                                                      ("--weight", float, 1.0, "OPD weight (constant arm) and GATS w_max"),
                                                      ("--student-sft-steps", int, 0, "0: the student starts at the teacher's SFT base")])
    t0 = time.time()
    cfg = C.load_config(args, [])
    task, train, held, path, sft = C.sft_start(cfg, args.seed)
    if args.teacher_steps:
        teacher_path, teacher_held = D.rl_checkpoint(cfg, task, train, held, path, args.seed, args.teacher_steps, "grpo_teacher")
    else:
        teacher_path, teacher_held = path, sft
    if args.student_sft_steps:
        path = D.sft_on(cfg, task, train[: cfg.sft.n_examples or None], args.seed, "weak_student", steps=args.student_sft_steps)
        model, tok = C.load_pretrained(path)
        sft = C.evaluate(model, tok, task, held, cfg.eval, args.seed)[0]
    print(f"student start held-out greedy {sft['greedy_accuracy']:.4f}; teacher ({args.teacher_steps} GRPO steps) {teacher_held['greedy_accuracy']:.4f}", flush=True)
    settings = {
        "grpo": {"advantage": "grpo"},
        "opd_const": {"advantage": "opd", "options": {"opd": {"weight": args.weight, "reward_weight": 1.0}}},
        "gats": {"advantage": "gats", "options": {"gats": {"w_max": args.weight}}},
    }
    k = max(1, args.steps // 5)
    arms, gats_weights = {}, []
    for arm in ARMS:
        rl_cfg = resolve.updated(cfg.rl, "rl", **settings[arm])
        teachers = {"teacher": D.frozen(teacher_path)} if arm != "grpo" else {}
        on_step = (lambda s, r: gats_weights.append(r.batch.extras["gats_weight"][0].item())) if arm == "gats" else None
        history, after, seconds = C.run_arm(cfg, rl_cfg, task, train, held, path, args.seed, on_step=on_step, teachers=teachers)
        arms[arm] = {"heldout_after": after, "rl_seconds": round(seconds, 1), "_history": history, "_cfg": cfg.model_copy(update={"rl": rl_cfg})}
        print(f"{arm}: {seconds:.0f}s, held-out greedy {after['greedy_accuracy']:.4f}", flush=True)
    arms["gats"]["weight_curve"] = [round(sum(gats_weights[i:i + k]) / len(gats_weights[i:i + k]), 4) for i in range(0, len(gats_weights), k)]
    rows = [D.summary_row(a, arms[a], k) for a in ARMS]
    text = C.print_table(f"\nGATS vs constant OPD vs GRPO, {args.steps} steps, teacher held-out {teacher_held['greedy_accuracy']:.4f} (first/last {k} steps)", rows)
    print("gats weight per window:", arms["gats"]["weight_curve"])
    D.finish(args, cfg, "gats_vs_opd", arms, rows, text, {"sft_heldout": sft, "teacher_heldout": teacher_held, "teacher_steps": args.teacher_steps,
                                                      "student_sft_steps": args.student_sft_steps, "k": k}, t0)


if __name__ == "__main__":
    C.run_seeds(main, "gats_vs_opd")
