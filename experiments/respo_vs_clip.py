"""Claim (d): with rollout reuse (rl.epochs_per_batch >= 2) ReSPO's sequence-level kernel (positive branch
floored at phi_min) avoids starving positive-advantage tokens, which PPO clipping zeroes once their ratio
exceeds 1 + eps_high, and so learns faster / better than `clip`.

Both arms start from the same SFT checkpoint with the same seed. Starvation diagnostic, on every policy pass
of every step (the first pass of a batch is on-policy, ratio = 1, so it is reported separately):
  clip_zero_frac   A>0 tokens whose clip gradient is exactly 0 (ratio > 1 + eps_high)
  respo_floor_frac A>0 tokens whose ReSPO weight sits on the floor phi_min (raw phi_+ < phi_min)
  pos_weight_mean  mean gradient weight on A>0 tokens (clip: ratio, or 0 when clipped; respo: phi_+)
Both criteria are evaluated in both arms (on that arm's own tokens); the arm's own loss decides the update.

    .venv/bin/python experiments/respo_vs_clip.py [--steps N] [--json FILE] [--tracking-uri URI] [--micro]
"""

from __future__ import annotations

import time
from collections import defaultdict

import torch

import _common as C
from posttrain import resolve
from posttrain.objectives import losses
from posttrain.objectives.policy_losses import per_token
from posttrain.objectives.respo import log_kernel, sequence_log_weight

ARMS = ("clip", "respo")
DIAG: dict[str, dict] = {}  # arm -> {"on": [..], "reuse": [..]} of per-pass diagnostics


PASSES = {"epochs": 1, "calls": defaultdict(int)}  # per run (reset by `diagnosed`): passes per batch, calls per loss


def diagnosed(name: str, epochs: int):
    """The registered loss `name`, recording the starvation diagnostic of every pass (counts calls per batch).
    Registered once per process; each run (one seed of the claims harness) starts its own counts."""
    PASSES["epochs"], PASSES["calls"][name] = epochs, 0
    DIAG.pop(name, None)
    if f"{name}_diag" in losses:
        return f"{name}_diag"
    base = losses.get(name)

    def loss(logp, old_logp, adv, mask, cfg):
        with torch.no_grad():
            a = per_token(adv, logp)
            m = mask.to(logp.dtype)
            pos = (a > 0).to(m.dtype) * m
            n_pos = pos.sum().clamp(min=1.0)
            ratio = torch.exp(logp - old_logp)
            zero = (ratio > 1.0 + cfg.clip_eps_high).to(m.dtype)
            opts = cfg.options_for("respo")
            raw = torch.exp(log_kernel(sequence_log_weight(logp, old_logp, mask), opts.a_pos, opts.lambda_pos)).expand_as(logp)
            floored = (raw < opts.phi_min).to(m.dtype)
            weight = ratio * (1 - zero) if name == "clip" else raw.clamp(min=opts.phi_min)
            d = {"clip_zero_frac": float((zero * pos).sum() / n_pos), "respo_floor_frac": float((floored * pos).sum() / n_pos),
                 "pos_weight_mean": float((weight * pos).sum() / n_pos)}
        DIAG.setdefault(name, defaultdict(list))["on" if PASSES["calls"][name] % PASSES["epochs"] == 0 else "reuse"].append(d)
        PASSES["calls"][name] += 1
        return base(logp, old_logp, adv, mask, cfg)

    meta = {k: v for k, v in losses.entry(name).meta.items() if k != "options"}  # it reads rl.options.<name>, not its own block
    losses.register(f"{name}_diag", **meta)(loss)
    return f"{name}_diag"


def mean_diag(rows: list[dict]) -> dict:
    return {k: sum(r[k] for r in rows) / max(len(rows), 1) for k in ("clip_zero_frac", "respo_floor_frac", "pos_weight_mean")}


def main() -> None:
    args = C.parse_args(__doc__.split("\n")[0], 250, [("--epochs", int, 4, "rl.epochs_per_batch (rollout reuse)")])
    t0 = time.time()
    names = {a: diagnosed(a, args.epochs) for a in ARMS}  # registered before config validation sees the names
    cfg = C.load_config(args, [f"rl.epochs_per_batch={args.epochs}"])
    task, train, held, path, sft = C.sft_start(cfg, args.seed)
    print(f"SFT held-out: greedy {sft['greedy_accuracy']:.4f} sampled {sft['sampled_accuracy']:.4f}", flush=True)
    k = max(1, min(50, args.steps // 5))
    arms = {}
    for arm in ARMS:
        rl_cfg = resolve.updated(cfg.rl, "rl", **{"loss": names[arm]})
        history, after, seconds = C.run_arm(cfg, rl_cfg, task, train, held, path, args.seed)
        diag = DIAG.get(arm, {})
        arms[arm] = {
            "train_accuracy_curve": C.curve(history, "accuracy"),
            "train_accuracy_first_k": C.window_mean(history, "accuracy", True, k),
            "train_accuracy_last_k": C.window_mean(history, "accuracy", False, k),
            "heldout_before": sft, "heldout_after": after, "rl_seconds": round(seconds, 1),
            "starvation_reuse_passes": mean_diag(diag.get("reuse", [])),
            "starvation_onpolicy_passes": mean_diag(diag.get("on", [])),
            "last_pass_clip_fraction_mean": C.window_mean(history, "clip_fraction", True, len(history)),
            "_history": history, "_cfg": cfg.model_copy(update={"rl": rl_cfg}),
        }
        print(f"{arm}: {seconds:.0f}s, held-out greedy {after['greedy_accuracy']:.4f}", flush=True)
    rows = [{"arm": a, "train_acc_first": arms[a]["train_accuracy_first_k"], "train_acc_last": arms[a]["train_accuracy_last_k"],
             "heldout_greedy_before": sft["greedy_accuracy"], "heldout_greedy_after": arms[a]["heldout_after"]["greedy_accuracy"],
             "heldout_sampled_after": arms[a]["heldout_after"]["sampled_accuracy"],
             **{f"reuse_{key}": v for key, v in arms[a]["starvation_reuse_passes"].items()}} for a in ARMS]
    curve_rows = [{"arm": a, "train_accuracy_curve": " ".join(f"{x:.3f}" for x in arms[a]["train_accuracy_curve"])} for a in ARMS]
    text = C.print_table(f"\nrespo vs clip, epochs_per_batch={args.epochs}, {args.steps} steps (first/last {k} steps; starvation on reuse passes)", rows)
    text += "\n" + C.print_table("\ntraining accuracy curve (10 windows)", curve_rows)
    runs = {}
    if cfg.tracking.enabled:
        for a in ARMS:
            final = {**{f"heldout_{m}": v for m, v in arms[a]["heldout_after"].items()},
                     **{f"reuse_{key}": v for key, v in arms[a]["starvation_reuse_passes"].items()},
                     "train_accuracy_last_k": arms[a]["train_accuracy_last_k"]}
            runs[a] = C.log_arm(arms[a]["_cfg"], f"respo_vs_clip/{a}", arms[a]["_history"], final, rows, text)
    for a in ARMS:
        arms[a].pop("_history"), arms[a].pop("_cfg")
    results = {"claim": "respo_vs_clip", "steps": args.steps, "epochs_per_batch": args.epochs, "k": k, "sft_heldout": sft,
               "arms": arms, "table": rows, "mlflow_runs": runs, "runtime_s": round(time.time() - t0, 1)}
    print(f"runtime {results['runtime_s']}s")
    C.write_json(args, results)


if __name__ == "__main__":
    C.run_seeds(main, "respo_vs_clip")
