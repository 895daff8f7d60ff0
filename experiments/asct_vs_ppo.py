"""Claim (ASCT, spec §24): PPO credited by ASCT's counterfactual tree (the frozen actor's centred Q_hat at every visited
state) gives a search agent a higher held-out utility (F1 minus cost per search call) than trajectory-return PPO, and
than PPO with a Monte-Carlo value baseline (VinePPO) at matched auxiliary tokens.

Per seed, in the search environment of recipes/search/params.yaml (envs/search.py: the seeded corpus, BM25 top-2, multi-hop
questions, 0.1 per call), the same actor initialisation, rounds, episodes and PPO settings for every arm (recipes/search/asct_trainer.py):

    asct            asct.credit asct, tree policy uniform, asct.n_sim simulations per visited state
    asct_agent_uct  the same with the cost-aware tree policy agent_uct (kappa = asct.cost_weight)
    trajectory      asct.credit trajectory: U - mean U on every action (no auxiliary tokens)
    mc_value        asct.credit mc_value at matched auxiliary tokens: from each visited state it rolls the frozen actor
                    out until its rollouts have written as many tokens as the `asct` arm spent per visited state
                    (asct.mc_token_budget = that arm's aux_tokens / its visited states)

Each arm's held-out figures are the greedy actor alone (deployment: no tree): utility, F1, search calls, gold-passage
recall; with `--set asct.eval_samples=k` also the same figures over k episodes sampled from the actor per question
(`sampled_*`: the credit arms can end at one greedy policy and still differ in what they sample); plus the auxiliary
tokens it spent in training (in total and per visited state). The harness pairs ASCT with each baseline by seed; the
two tree policies are compared only on seeds where their searches differed (their auxiliary tokens, _premises.py).

    .venv/bin/python experiments/claims.py --claim asct_lm_vs_ppo       (the LM actor: 10 rounds of 8 episodes, N = 4)
    .venv/bin/python experiments/claims.py --claim asct_vs_ppo          (the MLP actor: 40 rounds)
    .venv/bin/python experiments/claims.py --claim asct_vs_ppo_short    (the MLP actor: 12 rounds)
    .venv/bin/python experiments/asct_vs_ppo.py [--steps N] [--seeds 3] [--json FILE] [--micro]

--params defaults to recipes/search/params.yaml; --steps sets asct.iterations.
"""

from __future__ import annotations

import time

import _common as C
from posttrain import resolve
from posttrain.recipes.search.asct_stages import search_setup
from posttrain.recipes.search.asct_trainer import ASCTTrainer, train_asct
from posttrain.trainers.loop import TrainLoop

MICRO = ["task.n_train=40", "task.n_heldout=10", "asct.n_heldout=5", "asct.episodes=3", "asct.n_sim=3", "asct.mc_rollouts=3",
         "task.options.search.people=30", "task.options.search.companies=6", "task.options.search.cities=6", "asct.lm.sft_steps=2", "asct.lm.sft_batch_size=4",
         "model.hidden_size=16", "model.intermediate_size=32", "model.layers=1", "model.heads=2", "model.kv_heads=1"]


SHORT = 20  # rounds: a run below it is the short-budget claim (asct_vs_ppo_short: does the tree's credit learn sooner?)


def claim_of(argv: list[str]) -> str:
    """The claim a command line runs: `asct_lm_vs_ppo` (the LM actor, the default), or with `--set asct.actor=mlp`
    `asct_vs_ppo` (the MLP actor), `asct_vs_ppo_short` with --steps below SHORT."""
    if "asct.actor=mlp" not in argv:
        return "asct_lm_vs_ppo"
    steps = int(argv[argv.index("--steps") + 1]) if "--steps" in argv else 40
    return "asct_vs_ppo_short" if steps < SHORT else "asct_vs_ppo"


def main() -> None:
    args = C.parse_args(__doc__.split("\n")[0], 40)
    if args.params == C.REPO / "params.yaml":
        args.params = C.REPO / "recipes" / "search" / "params.yaml"
    t0 = time.time()
    cfg = C.load_config(args, (MICRO if args.micro else []) + [f"asct.iterations={args.steps}", "asct.checkpoint_every=0"])
    env, train, held = search_setup(cfg, args.seed)
    base = cfg.asct
    warm = ASCTTrainer(base, env, train, args.seed, cfg.model)  # every arm starts from this actor (the LM: warm-started once)
    warm.actor.warm_start(env, train, base, args.seed)
    initial = {k: v.clone() for k, v in warm.actor.state_dict().items()}
    arms = {"asct": {"credit": "asct", "tree_policy": "uniform"}, "asct_agent_uct": {"credit": "asct", "tree_policy": "agent_uct"},
            "trajectory": {"credit": "trajectory"}, "mc_value": {"credit": "mc_value"}}
    table, runs, curves, per_visit, runs_history = [], {}, {}, 0, {}
    for arm, update in arms.items():
        if arm == "mc_value":  # ASCT's (uniform tree) mean auxiliary tokens per visited state: the value baseline's budget
            update = {**update, "mc_token_budget": max(1, round(per_visit))}
        arm_cfg = resolve.updated(base, "asct", **update)
        start = time.time()
        _, history, final, _ = train_asct(arm_cfg, env, train, held, args.seed, TrainLoop(), model_cfg=cfg.model, initial=initial)
        visits = sum(h["visits"] for h in history)
        runs_history[arm] = history
        if arm == "asct":
            per_visit = final["aux_tokens"] / visits
        row = {"arm": arm, "actor": base.actor, **{k.removeprefix("heldout_"): v for k, v in final.items() if k.startswith("heldout_")},
               "aux_tokens": final["aux_tokens"], "aux_tokens_per_visit": final["aux_tokens"] / visits,
               "train_utility_last": C.window_mean(history, "train_utility", False, max(1, len(history) // 5)),
               "seconds": round(time.time() - start, 1)}
        table.append(row)
        curves[arm] = C.curve(history, "train_utility")
        print(f"seed {args.seed} {arm}: held-out utility {row['utility']:.3f} F1 {row['f1']:.3f} calls {row['calls']:.2f} "
              f"aux tokens {row['aux_tokens']:.0f} ({row['aux_tokens_per_visit']:.0f} per visited state, {row['seconds']:.0f}s)", flush=True)
        if cfg.tracking.enabled:
            runs[arm] = (history, cfg.model_copy(update={"asct": arm_cfg}), final)
    text = C.print_table(f"\nASCT vs PPO in the search environment, {args.steps} rounds, seed {args.seed}, {len(held)} held-out questions", table)
    mlflow_runs = {arm: C.log_arm(arm_cfg, f"asct_vs_ppo/{arm}", history, final, table, text) for arm, (history, arm_cfg, final) in runs.items()}
    C.write_json(args, {"claim": claim_of(["--steps", str(args.steps), *args.set]), "steps": args.steps, "seed": args.seed, "table": table, "train_curve": curves,
                        "mc_token_budget": max(1, round(per_visit)), "mlflow_runs": mlflow_runs, "actor": base.actor,
                        "q_spread": [h.get("q_spread", 0.0) for h in runs_history["asct"]],
                        "runtime_s": round(time.time() - t0, 1)})


if __name__ == "__main__":
    import sys

    C.run_seeds(main, claim_of(sys.argv[1:]))
