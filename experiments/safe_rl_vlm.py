"""Claim (VLM-Safe-RL, specs §16): in the driving environment (recipes/safe_rl/driving.py), PPO-Lagrangian lowers the catastrophe
rate (share of episodes with a collision or a road exit) and the cost of plain PPO, at a cost in progress; the VLM
terms (frozen-CLIP reward shaping alpha_clip and the risk term kappa of the multiplier update) are claimed to lower
catastrophes further, and the risk term to raise the multiplier (the abstract reports catastrophe reduction but
that the VLM term barely moves the multiplier: the last two are expected inconclusive).

Per seed: the tiny CLIP is trained once (recipes/safe_rl/trainer.py `train_encoder`, the drive_encoder stage's loop), then
each arm trains the agent over the same frozen encoder, seed and traffic, and is scored on `eval_episodes` greedy
held-out episodes. Arms (the safe_rl section otherwise as in params.yaml):

    ppo                 lagrangian false, alpha_clip 0, kappa 0 (lambda stays 0)
    ppo_lag             alpha_clip 0, kappa 0 (plain PPO-Lagrangian)
    ppo_lag_vlm         alpha_clip, kappa as in params.yaml (0.1, 0.1)
    ppo_lag_vlm_kappa0  alpha_clip as in params.yaml, kappa 0 (the multiplier term ablated)

    .venv/bin/python experiments/safe_rl_vlm.py [--steps ROUNDS] [--seeds 3] [--json FILE] [--tracking-uri URI] [--micro]
"""

from __future__ import annotations

import hashlib
import json
import time

import _common as C
from posttrain.models.image_text import ImageTextEncoder, save_image_text
from posttrain.recipes.safe_rl.trainer import train_encoder, train_safe_rl

ARMS = {
    "ppo": {"lagrangian": False, "alpha_clip": 0.0, "kappa": 0.0},
    "ppo_lag": {"alpha_clip": 0.0, "kappa": 0.0},
    "ppo_lag_vlm": {},
    "ppo_lag_vlm_kappa0": {"kappa": 0.0},
}
MICRO = ["safe_rl.encoder.n_frames=200", "safe_rl.encoder.n_heldout=50", "safe_rl.encoder.steps=3", "safe_rl.encoder.batch_size=32",
         "safe_rl.env.horizon=8", "safe_rl.envs=4", "safe_rl.eval_episodes=2"]


def encoder_for(cfg, seed: int):
    """(the frozen encoder, its held-out figures): trained once per (env, encoder settings, prompts, seed)."""
    fields = {k: v for k, v in cfg.safe_rl.model_dump(mode="json").items() if k in ("env", "encoder", "safe_prompt", "danger_prompt")}
    path = C.CACHE / f"drive_encoder_{hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]}_s{seed}"
    if not (path / "done").exists():
        model, tokenizer, figures, _ = train_encoder(cfg.safe_rl, seed)
        save_image_text(model, tokenizer, path)
        (path / "figures.json").write_text(json.dumps(figures))
        (path / "done").write_text("ok")
    return ImageTextEncoder.load(path), json.loads((path / "figures.json").read_text())


def main() -> None:
    args = C.parse_args(__doc__.split("\n")[0], 40, [("--arms", str, ",".join(ARMS), "comma-separated arms to run")])
    t0 = time.time()
    cfg = C.load_config(args, (MICRO if args.micro else []) + [f"safe_rl.iterations={args.steps}", "safe_rl.checkpoint_every=0"])
    encoder, enc = encoder_for(cfg, args.seed)
    print(f"encoder (seed {args.seed}): danger-phrase accuracy {enc['danger_phrase_accuracy']:.3f}, score on safe frames "
          f"{enc['score_safe_frames']:+.3f}, on about-to-crash frames {enc['score_crash_frames']:+.3f}", flush=True)
    arms, rows = {}, []
    for name in args.arms.split(","):
        arm_cfg = cfg.safe_rl.model_copy(update=ARMS[name])
        start = time.time()
        _, history, final, _ = train_safe_rl(arm_cfg, encoder, args.seed)
        k = max(1, len(history) // 4)
        row = {"arm": name, "catastrophe_rate": final["final_catastrophe_rate"], "cost": final["final_cost"],
               "cost_normalised": final["final_cost_normalised"], "progress": final["final_progress"],
               "train_catastrophe_last": C.window_mean(history, "catastrophe_rate", False, k), "train_cost_last": C.window_mean(history, "cost", False, k),
               "lambda_mean": sum(h["lambda"] for h in history) / len(history), "lambda_final": final["lambda"],
               "kappa_term_mean": arm_cfg.kappa * sum(h["risk"] - arm_cfg.risk_threshold for h in history) / len(history)}
        rows.append(row)
        arms[name] = {"final": final, "seconds": round(time.time() - start, 1), "catastrophe_curve": C.curve(history, "catastrophe_rate"),
                      "cost_curve": C.curve(history, "cost"), "progress_curve": C.curve(history, "progress"), "lambda_curve": C.curve(history, "lambda"),
                      "_history": history, "_cfg": cfg.model_copy(update={"safe_rl": arm_cfg})}
        print(f"{name}: {arms[name]['seconds']}s, held-out catastrophe rate {row['catastrophe_rate']:.3f}, cost {row['cost']:.3f}, "
              f"progress {row['progress']:.3f}, mean lambda {row['lambda_mean']:.3f}", flush=True)
    text = C.print_table(f"\nVLM-Safe-RL in the driving environment, {args.steps} rounds x {cfg.safe_rl.envs} episodes; "
                         f"{cfg.safe_rl.eval_episodes} greedy held-out episodes per arm (seed {args.seed})", rows)
    runs = {}
    if cfg.tracking.enabled:
        for name, a in arms.items():
            runs[name] = C.log_arm(a["_cfg"], f"safe_rl_vlm/{name}", a["_history"], {**a["final"], **{f"encoder_{k}": v for k, v in enc.items()}},
                                   rows, text)
    for a in arms.values():
        a.pop("_history"), a.pop("_cfg")
    C.write_json(args, {"claim": "safe_rl_vlm", "steps": args.steps, "encoder": enc, "arms": arms, "table": rows, "mlflow_runs": runs,
                        "runtime_s": round(time.time() - t0, 1)})


if __name__ == "__main__":
    C.run_seeds(main, "safe_rl_vlm")
