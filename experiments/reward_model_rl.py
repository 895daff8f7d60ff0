"""Claim: online RL against a learned reward model (`bt`, a Bradley-Terry value head, or `trm`, the generative
Thinking Reward Model trained with PD-GRPO; both trained on `reward_model.data` pairs, no verifier at RL time)
improves the task's *true* held-out accuracy; the verifier-rewarded arm is the reference.

All arms start from the same SFT checkpoint with the same seed. A learned-reward arm's rewards are [bt or trm
(weight 1), correctness (weight 0)]: the verifier column only monitors true accuracy, it adds nothing to the
advantage. Each reward model is trained once per config (the reward_model stage's trainer, from the
`reward_models` registry) and cached.

    .venv/bin/python experiments/reward_model_rl.py [--steps N] [--json FILE] [--tracking-uri URI] [--micro]
"""

from __future__ import annotations

import json
import time

import torch

import _common as C
from posttrain import resolve
from posttrain.config import RewardSpec
from posttrain.models import load_pretrained
from posttrain.models.sampling import generate
from posttrain.rewards import reward_models, rewards
from posttrain.stages.preference import load_pairs

BT = (RewardSpec(name="bt", weight=1.0), RewardSpec(name="correctness", weight=0.0))
TRM = (RewardSpec(name="trm", weight=1.0), RewardSpec(name="correctness", weight=0.0))
ARMS = {  # name: (rewards, extra rl settings)
    "bt": (BT, {}),
    "trm": (TRM, {}),
    "bt_kl": (BT, {"beta": 0.1}),  # the usual RLHF guard against over-optimising a learned reward: k3 KL to the SFT policy
    "bt_clip": (BT, {"options.bt.clip": True}),  # r clamped to the RM's held-out range: no payoff beyond real preferred answers
    "bt_format": ((*BT, RewardSpec(name="format", weight=1.0)), {}),  # plus a rule-based format reward
    "verifier": ((RewardSpec(name="correctness", weight=1.0), RewardSpec(name="format", weight=0.1)), {}),
}


def reward_model(cfg, kind: str, task, train, held, sft_path, seed: int):
    """(directory holding model/, held-out metrics): the reward model `kind`, trained once per config."""
    cfg = cfg.model_copy(update={"reward_model": cfg.reward_model.model_copy(update={"kind": kind})})
    out = C.CACHE / f"{kind}_{cfg.section_hash('task', 'model', 'sft', 'reward_model')}_s{seed}"
    if not (out / "done").exists():
        model, tokenizer = load_pretrained(sft_path)
        train_pairs, held_pairs = load_pairs(cfg, cfg.reward_model, task, train, held, (model, tokenizer))
        out.mkdir(parents=True, exist_ok=True)
        metrics = reward_models.get(kind)(cfg, sft_path, train_pairs, held_pairs, out, seed, on_log=lambda s, m: None)
        (out / "metrics.json").write_text(json.dumps(metrics))
        (out / "done").write_text("ok")
    return out, json.loads((out / "metrics.json").read_text())


@torch.no_grad()
def best_of_n(cfg, kinds, task, held, sft_path, rl_options: dict, seed: int, n: int = 8) -> dict[str, float]:
    """Held-out accuracy when each reward model picks one of n SFT samples per prompt (the first of tied best), with
    a random pick and the oracle (any correct sample) for scale: how well it ranks what RL will show it first."""
    model, tokenizer = load_pretrained(sft_path)
    out, texts = generate(model, tokenizer, [e.prompt for e in held], cfg.rl.max_new_tokens, group_size=n,
                          generator=torch.Generator().manual_seed(seed + 1))
    finished = out.finished.cpu().tolist()
    examples = [e for e in held for _ in range(n)]
    correct = rewards.get("correctness")(task, examples, texts, finished).view(-1, n)
    result = {"n": n, "random_pick_accuracy": float(correct.mean()), "oracle_accuracy": float(correct.max(1).values.mean())}
    rl = resolve.updated(cfg.rl, "rl", **{"options": rl_options})
    for kind in kinds:
        scores = rewards.get(kind)(task, examples, texts, finished, rl=rl).view(-1, n)
        result[f"{kind}_pick_accuracy"] = float(correct.gather(1, scores.argmax(1, keepdim=True)).mean())
    return result


def main() -> None:
    args = C.parse_args(__doc__.split("\n")[0], 400, [("--arms", str, ",".join(ARMS), "comma-separated arms to run")])
    t0 = time.time()
    cfg = C.load_config(args, [])
    task, train, held, path, sft = C.sft_start(cfg, args.seed)
    print(f"SFT held-out: greedy {sft['greedy_accuracy']:.4f} sampled {sft['sampled_accuracy']:.4f}", flush=True)
    names = args.arms.split(",")
    kinds = [k for k in ("bt", "trm") if any(ARMS[a][0][0].name == k for a in names)]
    rms = {k: reward_model(cfg, k, task, train, held, path, args.seed) for k in kinds}
    for k, (_, m) in rms.items():
        print(f"{k} reward model held-out pair accuracy {m['heldout_pair_accuracy']:.4f}", flush=True)
    options = {k: {"path": str(d)} for k, (d, _) in rms.items()}  # merged over rl.options by resolve.updated
    rm_metrics = {k: m for k, (_, m) in rms.items()}
    picks = best_of_n(cfg, kinds, task, held, path, {**options, "bt": {**options.get("bt", {}), "clip": False}}, args.seed)
    print(f"best of {picks['n']} SFT samples on held-out prompts: " + ", ".join(f"{k} {v:.4f}" for k, v in picks.items() if k != "n"), flush=True)
    arms, rows = {}, []
    k = max(1, min(20, args.steps // 5))
    for arm in names:
        specs, extra = ARMS[arm]
        arm_options = {**options, "bt": {**options.get("bt", {}), "clip": extra.get("options.bt.clip", False)}}
        extra = {k: v for k, v in extra.items() if not k.startswith("options.")}
        rl_cfg = resolve.updated(cfg.rl, "rl", **{"rewards": specs, "options": arm_options, **extra})
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
    accuracy = ", ".join(f"{k} {m['heldout_pair_accuracy']:.4f}" for k, m in rm_metrics.items())
    text = C.print_table(f"\nRL with a learned reward vs the verifier ({args.steps} steps; RM held-out pair accuracy: {accuracy})", rows)
    runs = {}
    if cfg.tracking.enabled:
        for arm, a in arms.items():
            rm = rm_metrics.get(a["_cfg"].rl.rewards[0].name, {})
            final = {f"heldout_{m}": v for m, v in a["heldout_after"].items()} | {f"rm_{m}": v for m, v in rm.items()}
            runs[arm] = C.log_arm(a["_cfg"], f"reward_model_rl/{arm}", a["_history"], final, rows, text)
    for a in arms.values():
        a.pop("_history"), a.pop("_cfg")
    results = {"claim": "reward_model_rl", "steps": args.steps, "sft_heldout": sft, "reward_model": rm_metrics, "best_of_n": picks, "arms": arms,
               "table": rows, "mlflow_runs": runs, "runtime_s": round(time.time() - t0, 1)}
    print(f"runtime {results['runtime_s']}s")
    C.write_json(args, results)


if __name__ == "__main__":
    C.run_seeds(main, "reward_model_rl")
