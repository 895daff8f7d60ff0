"""Claim (RFPO): a frozen critic pretrained with labels can replace the verifier during RL: RFPO's binarised,
length-debiased critic reward improves held-out accuracy from the SFT start without any verifier call in the
training step, comparably to supervised PPO (verifier reward), while the raw (non-binarised) critic score is open
to the critic's length bias.

Per seed: the SFT start (cached), a success critic pretrained on the SFT policy's verifier-labelled rollouts
(trainers/critic.py: the only place labels are read), then three arms on the same RL budget from the same start:
`ppo` (preset ppo: verifier reward, learned critic), `rfpo` (preset rfpo: binarised debiased reward, frozen critic as
the GAE baseline), `rfpo_raw` (rfpo with binarize false: the raw score V(s_L)). Reported per seed and arm: held-out
greedy accuracy gain over SFT, the last-window completion length; over seeds: mean gains with 95% t intervals and
the paired differences rfpo - ppo and rfpo - rfpo_raw, each with a verdict (experiments/ppo_vs_grpo.py's rules).

    .venv/bin/python experiments/rfpo_vs_ppo.py [--steps N] [--seeds 3] [--json FILE] [--micro]
"""

from __future__ import annotations

import time

import _common as C
from ppo_vs_grpo import interval, resolve_preset, verdict_match, verdict_positive
from posttrain import resolve
from posttrain.models.value import save_critic
from posttrain.trainers.critic import train_critic
from posttrain.trainers.loop import TrainLoop

ARMS = ("ppo", "rfpo", "rfpo_raw")
CRITIC_MICRO = ["critic.n_prompts=20", "critic.samples_per_prompt=2", "critic.n_heldout_prompts=8", "critic.steps=4", "critic.batch_size=8"]


def pretrained_critic(cfg, task, train, held, path, seed: int):
    """The success critic of this SFT start (cached): its directory and held-out figures."""
    out = C.CACHE / f"critic_{cfg.section_hash('task', 'model', 'sft', 'critic')}_{cfg.rl.max_new_tokens}_s{seed}"
    if not (out / "done").exists():
        policy, tok = C.load_pretrained(path)
        C.seed_everything(seed)
        critic, _, final = train_critic(policy, tok, task, train, held, cfg, seed, TrainLoop(), on_log=lambda step, m: None)
        save_critic(critic, out / "model")
        tok.save_pretrained(out / "model")
        (out / "final.json").write_text(C.json.dumps(final))
        (out / "done").write_text("ok")
    return out, C.json.loads((out / "final.json").read_text())


def arm_settings(cfg, arm: str, critic_path) -> dict:
    if arm == "ppo":
        return resolve_preset(cfg, "ppo")
    keys = resolve_preset(cfg, "rfpo")
    keys["critic"] = cfg.rl.critic.model_copy(update={"path": str(critic_path)})
    keys["rewards"] = (cfg.rl.rewards[0].model_copy(update={"name": "rfpo", "weight": 1.0}),)  # the critic's score only
    keys["options"] = {"rfpo": {"binarize": arm == "rfpo"}}
    return keys


def main() -> None:
    args = C.parse_args(__doc__.split("\n")[0], 100)  # --seed / --seeds from the claims harness
    t0 = time.time()
    seeds = list(range(args.seed, args.seed + args.seeds))
    per_seed, gains, last = [], {a: [] for a in ARMS}, {}
    for seed in seeds:
        cfg = C.load_config(type(args)(**{**vars(args), "seed": seed}), CRITIC_MICRO if args.micro else [])
        task, train, held, path, sft = C.sft_start(cfg, seed)
        critic_path, critic_final = pretrained_critic(cfg, task, train, held, path, seed)
        row = {"seed": seed, "sft_greedy": sft["greedy_accuracy"], "critic_auc": critic_final["heldout_auc"],
               "critic_brier": critic_final["heldout_brier"], "critic_brier_base": critic_final["heldout_brier_base_rate"]}
        for arm in ARMS:
            rl_cfg = resolve.updated(cfg.rl, "rl", **arm_settings(cfg, arm, critic_path))
            history, after, seconds = C.run_arm(cfg, rl_cfg, task, train, held, path, seed)
            gain = after["greedy_accuracy"] - sft["greedy_accuracy"]
            k = max(1, len(history) // 5)
            row[f"{arm}_gain"], row[f"{arm}_len_last"] = gain, C.window_mean(history, "completion_length", False, k)
            row[f"{arm}_len_first"] = C.window_mean(history, "completion_length", True, k)
            gains[arm].append(gain)
            last[arm] = {"history": history, "cfg": cfg.model_copy(update={"rl": rl_cfg}), "after": after}
            print(f"seed {seed} {arm}: SFT {sft['greedy_accuracy']:.3f} -> {after['greedy_accuracy']:.3f}, length "
                  f"{row[f'{arm}_len_first']:.2f} -> {row[f'{arm}_len_last']:.2f} ({seconds:.0f}s)", flush=True)
        per_seed.append(row)
    text = C.print_table(f"\nRFPO vs supervised PPO on arithmetic, {args.steps} steps, seeds {seeds}", per_seed)
    summary = {}
    for arm in ARMS:
        mean, low, high = interval(gains[arm])
        summary[f"{arm}_gain"] = {"mean": mean, "ci95": [low, high], "verdict": verdict_positive(low, high)}
    for a, b in (("rfpo", "ppo"), ("rfpo", "rfpo_raw")):
        mean, low, high = interval([x - y for x, y in zip(gains[a], gains[b])])
        summary[f"{a}_minus_{b}"] = {"mean": mean, "ci95": [low, high], "verdict_match": verdict_match(low, high)}
    for key, s in summary.items():
        print(f"{key}: {s['mean']:+.4f} [{s['ci95'][0]:+.4f}, {s['ci95'][1]:+.4f}] {s.get('verdict', s.get('verdict_match'))}", flush=True)
    runs = {}
    if cfg.tracking.enabled:
        for arm in ARMS:
            final = {"gain_mean": summary[f"{arm}_gain"]["mean"], **{f"heldout_{k}": v for k, v in last[arm]["after"].items()}}
            runs[arm] = C.log_arm(last[arm]["cfg"], f"rfpo_vs_ppo/{arm}", last[arm]["history"], final, per_seed, text)
    C.write_json(args, {"claim": "rfpo_vs_ppo", "steps": args.steps, "seeds": seeds, "per_seed": per_seed, "summary": summary,
                        "gains": gains, "mlflow_runs": runs, "runtime_s": round(time.time() - t0, 1)})


if __name__ == "__main__":
    main()
