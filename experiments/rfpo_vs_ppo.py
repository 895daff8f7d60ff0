"""Claim (RFPO): a frozen critic pretrained with labels can replace the verifier during RL: RFPO's binarised,
length-debiased critic reward improves held-out accuracy from the SFT start without any verifier call in the
training step, comparably to supervised PPO (verifier reward), while the raw (non-binarised) critic score is open
to the critic's length bias.

One seed (`--seed`; the claims harness runs 3): the SFT start (cached), a success critic pretrained on the SFT
policy's verifier-labelled rollouts (recipes/rfpo/trainer.py: the only place labels are read), then three arms on the
same RL budget from the same start: `ppo` (preset ppo: verifier reward, learned critic), `rfpo` (preset rfpo:
binarised debiased reward, frozen critic as the GAE baseline), `rfpo_raw` (rfpo with binarize false: the raw score
V(s_L)). The results table has one row per arm: held-out greedy accuracy before and after RL, the gain, the mean
completion length, the verifier's accuracy of the training rollouts and the mean reward over the first and the last fifth
of the steps (the verifier scores every arm's rollouts for this record; only ppo's reward reads it), and the critic's
held-out AUC and Brier score.

The harness (experiments/_claims.py) pairs the arms by seed: RFPO's held-out accuracy after RL against the SFT
start's, RFPO against supervised PPO and against the raw score, and the raw score's length exploit (RFPO's late
completions shorter than the raw score's).

    .venv/bin/python experiments/claims.py --claim rfpo_vs_ppo
    .venv/bin/python experiments/rfpo_vs_ppo.py [--steps N] [--seeds 3] [--json FILE] [--micro]
"""

from __future__ import annotations

import _common as C
from ppo_vs_grpo import resolve_preset
from posttrain import resolve
from posttrain.models.value import save_critic
from posttrain.recipes.rfpo.trainer import train_critic
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
    """One seed (`--seed`): the critic's held-out figures and each arm's accuracy and lengths, as the results table."""
    args = C.parse_args(__doc__.split("\n")[0], 100)
    cfg = C.load_config(args, CRITIC_MICRO if args.micro else [])
    task, train, held, path, sft = C.sft_start(cfg, args.seed)
    critic_path, critic = pretrained_critic(cfg, task, train, held, path, args.seed)
    figures = {"critic_auc": critic["heldout_auc"], "critic_brier": critic["heldout_brier"], "critic_brier_base": critic["heldout_brier_base_rate"]}
    table, last = [], {}
    for arm in ARMS:
        # the verifier also scores the critic-rewarded arms' rollouts, for the record only (their reward is the critic's)
        rl_cfg = resolve.updated(cfg.rl, "rl", **{**arm_settings(cfg, arm, critic_path), "verify_rollouts": True})
        history, after, seconds = C.run_arm(cfg, rl_cfg, task, train, held, path, args.seed)
        k = max(1, len(history) // 5)
        row = {"arm": arm, "heldout_greedy_before": sft["greedy_accuracy"], "heldout_greedy_after": after["greedy_accuracy"],
               "gain": after["greedy_accuracy"] - sft["greedy_accuracy"], "len_first": C.window_mean(history, "completion_length", True, k),
               "len_last": C.window_mean(history, "completion_length", False, k), "train_acc_first": C.window_mean(history, "accuracy", True, k),
               "train_acc_last": C.window_mean(history, "accuracy", False, k), "reward_first": C.window_mean(history, "reward/total_mean", True, k),
               "reward_last": C.window_mean(history, "reward/total_mean", False, k), **figures, "seconds": round(seconds, 1)}
        table.append(row)
        last[arm] = (history, cfg.model_copy(update={"rl": rl_cfg}), after)
        print(f"seed {args.seed} {arm}: SFT {sft['greedy_accuracy']:.3f} -> {after['greedy_accuracy']:.3f}, length "
              f"{row['len_first']:.2f} -> {row['len_last']:.2f} ({seconds:.0f}s)", flush=True)
    text = C.print_table(f"\nRFPO vs supervised PPO on arithmetic, {args.steps} steps, seed {args.seed}", table)
    runs = {}
    if cfg.tracking.enabled:
        for row in table:
            history, arm_cfg, after = last[row["arm"]]
            final = {"gain": row["gain"], **{f"heldout_{k}": v for k, v in after.items()}}
            runs[row["arm"]] = C.log_arm(arm_cfg, f"rfpo_vs_ppo/{row['arm']}", history, final, table, text)
    C.write_json(args, {"claim": "rfpo_vs_ppo", "steps": args.steps, "seed": args.seed, "critic": critic, "table": table, "mlflow_runs": runs})


if __name__ == "__main__":
    C.run_seeds(main, "rfpo_vs_ppo")
