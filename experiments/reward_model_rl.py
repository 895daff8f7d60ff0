"""Claim: online RL against a learned reward model (`bt`, a Bradley-Terry value head, or `trm`, the generative
Thinking Reward Model trained with PD-GRPO; both trained on `reward_model.data` pairs, no verifier at RL time)
improves the task's *true* held-out accuracy; the verifier-rewarded arm is the reference.

All arms start from the same SFT checkpoint with the same seed. A learned-reward arm's rewards are [bt or trm
(weight 1), correctness (weight 0)]: the verifier column only monitors true accuracy, it adds nothing to the
advantage. Each reward model is trained once per config (the reward_model stage's trainer, from the
`reward_models` registry) and cached.

The training prompts are split in two halves by prompt, drawn with the seed (`split_prompts`): RL runs on the RL
half in every arm. A same-prompt reward model (`bt`, `trm`, ...) learns from pairs on the RL prompts themselves, so
its TRM warm-up has been taught the preferred answers of exactly the prompts RL then asks (RL against it is close to
RL against a memorised verifier); a disjoint one (`bt_disjoint`, `trm_disjoint`) learns from pairs on the other
half only, so it must judge prompts it never saw. The JSON records, per reward model, how many of its training
pairs' prompts are RL prompts (`rm_prompt_overlap`: all of them, or none).

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
from posttrain.rollout.sampling import generate
from posttrain.rewards import reward_models, rewards
from posttrain.data.preferences import split_by_prompt
from posttrain.stages.preference import load_pairs

BT = (RewardSpec(name="bt", weight=1.0), RewardSpec(name="correctness", weight=0.0))
TRM = (RewardSpec(name="trm", weight=1.0), RewardSpec(name="correctness", weight=0.0))
ARMS = {  # name: (rewards, extra rl settings, the reward model's prompts: same as RL's or disjoint from them)
    "bt": (BT, {}, "same"),
    "trm": (TRM, {}, "same"),
    "bt_disjoint": (BT, {}, "disjoint"),
    "trm_disjoint": (TRM, {}, "disjoint"),
    "bt_kl": (BT, {"beta": 0.1}, "same"),  # the usual RLHF guard against over-optimising a learned reward: k3 KL to the SFT policy
    "bt_clip": (BT, {"options.bt.clip": True}, "same"),  # r clamped to the RM's held-out range: no payoff beyond real preferred answers
    "bt_format": ((*BT, RewardSpec(name="format", weight=1.0)), {}, "same"),  # plus a rule-based format reward
    "verifier": ((RewardSpec(name="correctness", weight=1.0), RewardSpec(name="format", weight=0.1)), {}, None),
}


def split_prompts(train: list, seed: int) -> dict[str, list]:
    """{"same": the RL prompts, "disjoint": the others}: the training examples halved by prompt, drawn with `seed`.
    RL runs on "same"; a reward model learns from the pairs of one side."""
    same, disjoint = split_by_prompt(train, seed)
    return {"same": same, "disjoint": disjoint}


def reward_model(cfg, kind: str, task, prompts: str, examples, held, sft_path, seed: int):
    """(directory holding model/, held-out metrics, its training pairs' prompts): the reward model `kind` trained on
    pairs from `examples` (the `prompts` side of the split), once per config."""
    cfg = cfg.model_copy(update={"reward_model": cfg.reward_model.model_copy(update={"kind": kind})})
    out = C.CACHE / f"{kind}_{prompts}_{cfg.section_hash('task', 'model', 'sft', 'reward_model')}_s{seed}"
    if not (out / "done").exists():
        model, tokenizer = load_pretrained(sft_path)
        train_pairs, held_pairs = load_pairs(cfg, cfg.reward_model, task, examples, held, (model, tokenizer))
        out.mkdir(parents=True, exist_ok=True)
        metrics = reward_models.get(kind)(cfg, sft_path, train_pairs, held_pairs, out, seed, on_log=lambda s, m: None)
        (out / "metrics.json").write_text(json.dumps(metrics))
        (out / "pair_prompts.json").write_text(json.dumps(sorted({p.prompt for p in train_pairs})))
        (out / "done").write_text("ok")
    return out, json.loads((out / "metrics.json").read_text()), set(json.loads((out / "pair_prompts.json").read_text()))


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
    sides = split_prompts(train, args.seed)
    rl_prompts = sides["same"]
    wanted = sorted({(ARMS[a][0][0].name, ARMS[a][2]) for a in names if ARMS[a][2] is not None})  # (kind, prompts)
    rms = {(k, side): reward_model(cfg, k, task, side, sides[side], held, path, args.seed) for k, side in wanted}
    rl_keys = {e.prompt for e in rl_prompts}  # what a pair records as its prompt
    overlap = {f"{k}_{side}": {"rm_pair_prompts": len(p), "rl_prompts": len(rl_keys), "rm_pair_prompts_in_rl": len(p & rl_keys)}
               for (k, side), (_, _, p) in rms.items()}
    for (k, side), (_, m, _) in rms.items():
        print(f"{k} reward model ({side} prompts) held-out pair accuracy {m['heldout_pair_accuracy']:.4f}; {overlap[f'{k}_{side}']}", flush=True)
    rm_metrics = {f"{k}_{side}": m for (k, side), (_, m, _) in rms.items()}
    picks = {}
    for side in sorted({side for _, side in wanted}):
        kinds = [k for k, s in wanted if s == side]
        side_options = {k: {"path": str(rms[(k, side)][0])} for k in kinds} | ({"bt": {"path": str(rms[("bt", side)][0]), "clip": False}} if "bt" in kinds else {})
        picks[side] = best_of_n(cfg, kinds, task, held, path, side_options, args.seed)
        print(f"best of {picks[side]['n']} SFT samples on held-out prompts ({side}-prompt RMs): "
              + ", ".join(f"{k} {v:.4f}" for k, v in picks[side].items() if k != "n"), flush=True)
    arms, rows = {}, []
    k = max(1, min(20, args.steps // 5))
    for arm in names:
        specs, extra, side = ARMS[arm]
        options = {n: {"path": str(rms[(n, side)][0])} for n in ("bt", "trm") if (n, side) in rms}  # merged over rl.options by resolve.updated
        arm_options = {**options, "bt": {**options.get("bt", {}), "clip": extra.get("options.bt.clip", False)}}
        extra = {k: v for k, v in extra.items() if not k.startswith("options.")}
        rl_cfg = resolve.updated(cfg.rl, "rl", **{"rewards": specs, "options": arm_options, **extra})
        last: dict = {}
        history, after, seconds = C.run_arm(cfg, rl_cfg, task, rl_prompts, held, path, args.seed, lambda step, r: last.update(r=r))  # noqa: B023  (runs within this arm)
        batch = last["r"].batch
        samples = [{"prompt": last["r"].prompts[i // rl_cfg.group_size].prompt, "completion": t, **{n: round(float(batch.rewards[i, j]), 3)
                    for j, n in enumerate(batch.reward_names)}} for i, t in enumerate(last["r"].texts[:16])]
        arms[arm] = {"heldout_before": sft, "heldout_after": after, "rl_seconds": round(seconds, 1),
                     "train_accuracy_curve": C.curve(history, "accuracy"), "reward_curve": C.curve(history, f"reward/{specs[0].name}_mean"),
                     "last_step_samples": samples,
                     "_history": history, "_cfg": cfg.model_copy(update={"rl": rl_cfg})}
        rows.append({"arm": arm, "rl_reward": specs[0].name, "rm_prompts": side or "-", "train_acc_first": C.window_mean(history, "accuracy", True, k),
                     "train_acc_last": C.window_mean(history, "accuracy", False, k), "heldout_greedy_before": sft["greedy_accuracy"],
                     "heldout_greedy_after": after["greedy_accuracy"], "heldout_sampled_before": sft["sampled_accuracy"],
                     "heldout_sampled_after": after["sampled_accuracy"]})
        print(f"{arm}: {seconds:.0f}s, held-out greedy {sft['greedy_accuracy']:.4f} -> {after['greedy_accuracy']:.4f}", flush=True)
    accuracy = ", ".join(f"{k} {m['heldout_pair_accuracy']:.4f}" for k, m in rm_metrics.items())
    text = C.print_table(f"\nRL with a learned reward vs the verifier ({args.steps} steps; RM held-out pair accuracy: {accuracy})", rows)
    runs = {}
    if cfg.tracking.enabled:
        for arm, a in arms.items():
            side = ARMS[arm][2]
            rm = rm_metrics.get(f"{a['_cfg'].rl.rewards[0].name}_{side}", {})
            final = {f"heldout_{m}": v for m, v in a["heldout_after"].items()} | {f"rm_{m}": v for m, v in rm.items()}
            runs[arm] = C.log_arm(a["_cfg"], f"reward_model_rl/{arm}", a["_history"], final, rows, text)
    for a in arms.values():
        a.pop("_history"), a.pop("_cfg")
    results = {"claim": "reward_model_rl", "steps": args.steps, "sft_heldout": sft, "reward_model": rm_metrics, "rm_prompt_overlap": overlap, "best_of_n": picks, "arms": arms,
               "table": rows, "mlflow_runs": runs, "runtime_s": round(time.time() - t0, 1)}
    print(f"runtime {results['runtime_s']}s")
    C.write_json(args, results)


if __name__ == "__main__":
    C.run_seeds(main, "reward_model_rl")
