"""Claim (c), RIDE (RL-Induced Direction Extrapolation): when the RL teacher is close to its base, extrapolating beyond the teacher
along the RL residual in representation space (lambda > 1) beats plain representation matching
(lambda = 1, OPRD) and output-space extrapolation of the same size.

Base B: the SFT model. Teacher T: B after `--teacher-steps` GRPO updates (close to B). The student starts at
B and is trained by the distillation term alone (`rl.loss: none`) on its own rollouts. Arms:
  oprd         ride, lambda = 1
  ride         ride, lambda = --lam
  output_space ride_logits, lambda = --lam (the extrapolation applied to log-probabilities)
Reported: held-out accuracy of B, T and each student; the mean squared RL residual ||h_T - h_B||^2.

    .venv/bin/python experiments/ride_vs_oprd.py [--steps N] [--teacher-steps M] [--lam L] [--json FILE] [--micro]
"""

from __future__ import annotations

import time

import _common as C
from posttrain import resolve
import _distill as D

ARMS = ("oprd", "ride", "output_space")


def main() -> None:
    args = C.parse_args(__doc__.split("\n")[0], 100, [("--teacher-steps", int, 30, "GRPO steps that make the teacher"),
                                                      ("--lam", float, 1.5, "extrapolation lambda of the ride arms")])
    t0 = time.time()
    cfg = C.load_config(args, [])
    task, train, held, path, base_held = C.sft_start(cfg, args.seed)
    teacher_path, teacher_held = D.rl_checkpoint(cfg, task, train, held, path, args.seed, args.teacher_steps, "grpo_teacher")
    print(f"base held-out greedy {base_held['greedy_accuracy']:.4f}; teacher {teacher_held['greedy_accuracy']:.4f}", flush=True)
    settings = {
        "oprd": ("ride", 1.0), "ride": ("ride", args.lam), "output_space": ("ride_logits", args.lam),
    }
    k = max(1, args.steps // 5)
    arms = {}
    for arm in ARMS:
        aux, lam = settings[arm]
        options = {aux: {"lam": lam}}
        rl_cfg = resolve.updated(cfg.rl, "rl", **{"loss": "none", "aux": (aux,), "options": options})
        teachers = {"teacher": D.frozen(teacher_path), "base": D.frozen(path)}
        history, after, seconds = C.run_arm(cfg, rl_cfg, task, train, held, path, args.seed, teachers=teachers)
        arms[arm] = {"lam": lam, "heldout_after": after, "rl_seconds": round(seconds, 1), "_history": history, "_cfg": cfg.model_copy(update={"rl": rl_cfg})}
        print(f"{arm}: {seconds:.0f}s, held-out greedy {after['greedy_accuracy']:.4f}", flush=True)
    rows = [{**D.summary_row(a, arms[a], k), "lam": arms[a]["lam"], "final_distance": C.window_mean(arms[a]["_history"], "ride/distance", False, k)} for a in ARMS]
    rows.insert(0, {"arm": "teacher", "train_acc_first": float("nan"), "train_acc_last": float("nan"), "heldout_greedy_after": teacher_held["greedy_accuracy"],
                    "heldout_sampled_after": teacher_held["sampled_accuracy"], "lam": float("nan"), "final_distance": float("nan")})
    rows.insert(0, {**rows[0], "arm": "base", "heldout_greedy_after": base_held["greedy_accuracy"], "heldout_sampled_after": base_held["sampled_accuracy"]})
    text = C.print_table(f"\nRIDE vs OPRD vs output-space extrapolation, {args.steps} steps, teacher = base + {args.teacher_steps} GRPO steps", rows)
    D.finish(args, cfg, "ride_vs_oprd", arms, [r for r in rows if r["arm"] in ARMS], text,
             {"base_heldout": base_held, "teacher_heldout": teacher_held, "teacher_steps": args.teacher_steps, "k": k}, t0)


if __name__ == "__main__":
    C.run_seeds(main, "ride_vs_oprd")
