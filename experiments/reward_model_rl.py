"""Claim: online RL against a learned Bradley-Terry reward model (`bt`, trained on task-derived preference pairs,
no verifier at RL time) improves the task's *true* held-out accuracy; the verifier-rewarded arm is the reference.

Both arms start from the same SFT checkpoint with the same seed. The `bt` arm's rewards are [bt (weight 1),
correctness (weight 0)]: the verifier column only monitors true accuracy, it adds nothing to the advantage.
The reward model is trained once per config (train_bt, the reward_model stage's trainer) and cached.

    .venv/bin/python experiments/reward_model_rl.py [--steps N] [--json FILE] [--tracking-uri URI] [--micro]
"""

from __future__ import annotations

import json
import time

import _common as C
from posttrain.config import RewardSpec
from posttrain.models import load_pretrained
from posttrain.stages.preference import load_pairs
from posttrain.rewards.bradley_terry import train_bt

BT = (RewardSpec(name="bt", weight=1.0), RewardSpec(name="correctness", weight=0.0))
ARMS = {  # name: (rewards, extra rl settings)
    "bt": (BT, {}),
    "bt_kl": (BT, {"beta": 0.1}),  # the usual RLHF guard against over-optimising a learned reward: k3 KL to the SFT policy
    "bt_format": ((*BT, RewardSpec(name="format", weight=1.0)), {}),  # plus a rule-based format reward
    "verifier": ((RewardSpec(name="correctness", weight=1.0), RewardSpec(name="format", weight=0.1)), {}),
}


def reward_model(cfg, task, train, held, sft_path, seed: int):
    """(directory holding model/, held-out metrics): a BT reward model on task pairs, trained once per config."""
    out = C.CACHE / f"bt_{cfg.section_hash('task', 'model', 'sft', 'reward_model')}_s{seed}"
    if not (out / "done").exists():
        model, tokenizer = load_pretrained(sft_path)
        train_pairs, held_pairs = load_pairs(cfg, cfg.reward_model, task, train, held, (model, tokenizer))
        out.mkdir(parents=True, exist_ok=True)
        metrics = train_bt(cfg, sft_path, train_pairs, held_pairs, out, seed, on_log=lambda s, m: None)
        (out / "metrics.json").write_text(json.dumps(metrics))
        (out / "done").write_text("ok")
    return out, json.loads((out / "metrics.json").read_text())


def main() -> None:
    args = C.parse_args(__doc__.split("\n")[0], 150, [("--arms", str, ",".join(ARMS), "comma-separated arms to run")])
    t0 = time.time()
    cfg = C.load_config(args, [])
    task, train, held, path, sft = C.sft_start(cfg, args.seed)
    print(f"SFT held-out: greedy {sft['greedy_accuracy']:.4f} sampled {sft['sampled_accuracy']:.4f}", flush=True)
    rm_dir, rm_metrics = reward_model(cfg, task, train, held, path, args.seed)
    print(f"BT reward model held-out pair accuracy {rm_metrics['heldout_pair_accuracy']:.4f}", flush=True)
    options = {**cfg.rl.options, "bt": {"path": str(rm_dir)}}
    arms, rows = {}, []
    k = max(1, min(20, args.steps // 5))
    for arm in args.arms.split(","):
        specs, extra = ARMS[arm]
        rl_cfg = cfg.rl.model_copy(update={"rewards": specs, "options": options, **extra})
        last: dict = {}
        history, after, seconds = C.run_arm(cfg, rl_cfg, task, train, held, path, args.seed, lambda step, r: last.update(r=r))
        batch = last["r"].batch
        samples = [{"prompt": last["r"].prompts[i // rl_cfg.group_size].prompt, "completion": t, **{n: round(float(batch.rewards[i, j]), 3)
                    for j, n in enumerate(batch.reward_names)}} for i, t in enumerate(last["r"].texts[:16])]
        arms[arm] = {"heldout_before": sft, "heldout_after": after, "rl_seconds": round(seconds, 1),
                     "train_accuracy_curve": C.curve(history, "accuracy"), "reward_curve": C.curve(history, f"reward/{specs[0].name}_mean"),
                     "last_step_samples": samples,
                     "_history": history, "_cfg": cfg.model_copy(update={"rl": rl_cfg})}
        rows.append({"arm": arm, "rl_reward": specs[0].name, "train_acc_first": C.window_mean(history, "accuracy", True, k),
                     "train_acc_last": C.window_mean(history, "accuracy", False, k), "heldout_greedy_before": sft["greedy_accuracy"],
                     "heldout_greedy_after": after["greedy_accuracy"], "heldout_sampled_before": sft["sampled_accuracy"],
                     "heldout_sampled_after": after["sampled_accuracy"]})
        print(f"{arm}: {seconds:.0f}s, held-out greedy {sft['greedy_accuracy']:.4f} -> {after['greedy_accuracy']:.4f}", flush=True)
    text = C.print_table(f"\nRL with a learned BT reward vs the verifier ({args.steps} steps; RM held-out pair accuracy "
                         f"{rm_metrics['heldout_pair_accuracy']:.4f})", rows)
    runs = {}
    if cfg.tracking.enabled:
        for arm, a in arms.items():
            final = {f"heldout_{m}": v for m, v in a["heldout_after"].items()} | {f"rm_{m}": v for m, v in rm_metrics.items()}
            runs[arm] = C.log_arm(a["_cfg"], f"reward_model_rl/{arm}", a["_history"], final, rows, text)
    for a in arms.values():
        a.pop("_history"), a.pop("_cfg")
    results = {"claim": "reward_model_rl", "steps": args.steps, "sft_heldout": sft, "reward_model": rm_metrics, "arms": arms,
               "table": rows, "mlflow_runs": runs, "runtime_s": round(time.time() - t0, 1)}
    print(f"runtime {results['runtime_s']}s")
    C.write_json(args, results)


if __name__ == "__main__":
    main()
