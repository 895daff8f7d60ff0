"""Run one claim or all of them through the claims harness (experiments/_claims.py): each arm on each of `--seeds`
seeds, a 95% interval per arm and for the claimed difference, a verdict, one JSON per claim in `--out-dir`
(default experiments/results/, from which `python docs/generate.py` writes the table in docs/claims.md), one MLflow
parent run per claim with a child run per arm x seed.

    .venv/bin/python experiments/claims.py --claim witness_vs_grpo [--seeds 3] [-- extra experiment flags]
    .venv/bin/python experiments/claims.py --all [--seeds 3] [--micro] [--no-mlflow]
    .venv/bin/python experiments/claims.py --list
    .venv/bin/python experiments/claims.py --merge a.json b.json --json experiments/results/<claim>.json

`--merge` joins one claim's results from runs of the same command on different seeds (e.g. `--seed 0 --seeds 1`
and `--seed 1 --seeds 2` in two processes or on two machines) into the results one `--seeds 3` run writes.

Each claim runs its experiment script with the flags recorded in CLAIMS below (the budget its row in
docs/claims.md was measured at); flags after `--` are appended (a later flag wins).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shlex
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# claim -> (experiment script, its flags at the measured budget)
CLAIMS: dict[str, tuple[str, list[str]]] = {
    "witness_vs_grpo": ("witness_vs_grpo", ["--steps", "150", "--samples", "32"]),
    "gdpo_vs_sum": ("gdpo_vs_sum", ["--steps", "60"]),
    # 300 steps at a quarter of the default rl.lr (4 passes over each batch): at 40 steps and lr 5e-4 the clip
    # baseline lost held-out accuracy on every seed; 2-5 min a seed on one shared core (load 4-7), measured with
    # --seeds 5 (seeds 0-2, then 3-4 merged: seed 1's clip baseline did not gain)
    "respo_vs_clip": ("respo_vs_clip", ["--steps", "300", "--set", "rl.lr=0.000125"]),
    "qglas_vs_quality": ("qglas_vs_quality", ["--steps", "60"]),
    # the teacher is the SFT start + 600 GRPO steps (as ride_vs_oprd's): ahead of the start by 0.09-0.17 on seeds 0, 2, 3,
    # not on seed 1 (-0.012). 600 student steps, as many as the teacher's: GATS's weight decays (to 0-0.04 in the last
    # fifth); at 60 steps it stayed at 0.12-0.39. Measured with --seeds 4, 4.5-6 min a seed on one shared core
    "gats_vs_opd": ("gats_vs_opd", ["--steps", "600", "--teacher-steps", "600"]),
    # SIPO's start SFT'd on all 4,000 training problems (plain + contrastive) for 3,000 steps: at the default 500 x
    # 1,000 it sat at the floor (2.6-2.8% held-out); this start solves 17-23% and still 43-63% of groups all fail
    "sipo_vs_grpo": ("sipo_vs_grpo", ["--steps", "60", "--set", "sft.n_examples=0", "--set", "sft.steps=3000"]),
    # the student SFT'd 350 steps (200 left it at the floor, 1.5-4% held-out): 13-20.5%, the 600-step teacher 30-36.5%
    "think_opd_worked_steps": ("think_opd_worked_steps", ["--steps", "40", "--set", "rl.prompts_per_step=16", "--set", "eval.n_prompts=200",
                                                          "--student-sft-steps", "350"]),
    # a teacher 600 GRPO steps from its base (the same model as gats_vs_opd's for a seed): above it by 0.09-0.17 on seeds
    # 0, 2, 3, not on seed 1 (-0.012); measured with --seeds 4 (0-2, then 3 merged), about 3 min a seed on one shared core
    "ride_vs_oprd": ("ride_vs_oprd", ["--steps", "100", "--teacher-steps", "600"]),
    "pr_opd_text_world": ("pr_opd_text_world", ["--steps", "60", "--warm-start", "15"]),
    # bt and trm, each trained on the RL prompts and on disjoint ones, and bt's three guards against over-optimisation, at
    # the reward models' default budget (5,000 steps: a TRM warmed up 800 steps judges no better than chance); about
    # 45 min a seed on one shared core, most of it the four reward models
    "reward_model_rl": ("reward_model_rl", ["--steps", "200", "--arms", "verifier,bt,trm,bt_disjoint,trm_disjoint,bt_kl,bt_clip,bt_format",
                                            "--set", "eval.n_prompts=200"]),
    # 300 pairwise RL steps after a 3,000-step warm-up: the 5,000-step default judged 0.97-1.00 of the held-out pairs
    # on 2 of 3 seeds, leaving PD-GRPO nothing to fix; 8-9 min a seed on one shared core (load 6-7), half of it the warm-up
    "trm_anti_polarisation": ("trm_anti_polarisation", ["--steps", "300", "--set", "reward_model.steps=3000"]),
    # the SFT start stopped once its greedy GPA on 100 training shots reaches 70 (105-170 SFT steps; held-out start
    # 70.8-79.7, room below the ceiling of 100); at the full 400 steps it starts at 97-98 and can only fall; 5 seeds,
    # 45-60 s a seed on one shared core (about 20 s more for each SFT start)
    "gm_dpo_flexbench": ("gm_dpo_flexbench", ["--steps", "100", "--sft-stop-gpa", "70"]),
    "abc_align_pseudo_labels": ("abc_align_pseudo_labels", ["--steps", "100"]),
    "glime_vs_naive": ("glime_vs_naive", []),
    # 600 policy steps with a KL of 0.05 to the start (the rubric generator keeps rl.beta): at 100 steps and no KL the
    # policy collapsed to one fixed reply in 13 of 15 arm-seeds and the oracle arm did not beat uniform on 3 of 5 seeds
    "care_dialogue": ("care_dialogue", ["--steps", "600", "--policy-beta", "0.05"]),
    "sdrl_strategies": ("sdrl_strategies", ["--steps", "100"]),
    # a 300-step SFT start (held-out Hit@1 0.43-0.65: room above it), 150 GRPO steps of 32 prompts x 8 per arm; measured
    # with --seeds 4, 4-6 min a seed on one shared core
    "kgpo_vs_hit1": ("kgpo_vs_hit1", ["--steps", "150", "--set", "sft.steps=300"]),
    # 300 GRPO steps per arm, 3-7 min a seed on one shared core; measured with --seeds 8 (seeds 0-3, then 4-7 merged)
    "audit_selective_control": ("audit_selective_control", ["--steps", "300"]),
    "safe_rl_vlm": ("safe_rl_vlm", ["--steps", "40"]),
    "aura_ppo": ("aura_ppo", ["--steps", "60"]),
    # measured at a small budget (the shared CPU gave each run a fifth of a core): 16-frame clips read at 8 x 8, 300 / 100 clips
    "motion_vs_rgb": ("motion_vs_rgb", ["--steps", "10", "--sft-steps", "400", "--set", "motion.video.frames=16", "--set", "motion.n_train=300",
                                        "--set", "motion.n_heldout=100", "--set", "motion.sft.lr=0.003", "--set", "motion.model.pool=4",
                                        "--set", "motion.model.encoder_width=16", "--set", "motion.rl.videos_per_step=4"]),
    "ppo_vs_grpo": ("ppo_vs_grpo", ["--steps", "300", "--set", "rl.critic.lr=0.002", "--set", "rl.critic.warmup_steps=10"]),
    # the critic at the stage's defaults (1,000 prompts drawn from the whole split x 4 rollouts, 600 steps): held-out AUC
    # 0.65-0.72 on 5 of 6 seeds (0.56 on seed 1, whose SFT start solves 16%); measured with --seeds 6, 2-4 min a seed
    "rfpo_vs_ppo": ("rfpo_vs_ppo", ["--steps", "100", "--set", "rl.critic.lr=0.002"]),
    "async_pace": ("async_pace", ["--steps", "200", "--every", "10"]),
    "async_pace_deterministic": ("async_pace", ["--steps", "200", "--every", "10", "--schedule", "deterministic"]),
    # the script's world: 50 people, every question kind (a third 2-hop), 50 train / 100 held-out questions; 10 iterations
    # of 4 questions x 4 episodes per arm after 400 SFT steps; 50-70 s a seed on one shared core
    "bridge_vs_baselines": ("bridge_vs_baselines", ["--steps", "10"]),
    # the MLP actor over action features; held-out figures of the greedy actor and of 8 episodes sampled per question
    "asct_vs_ppo": ("asct_vs_ppo", ["--steps", "40", "--set", "asct.actor=mlp", "--set", "asct.eval_samples=8"]),
    "asct_vs_ppo_short": ("asct_vs_ppo", ["--steps", "12", "--set", "asct.actor=mlp", "--set", "asct.eval_samples=8"]),
    # the LM actor: 20 rounds of 8 episodes, N = 8 (above the 4 legal actions at a question: the tree policies can differ),
    # a 32-wide LM warm-started 30 steps, 60 held-out questions, greedy and 4 sampled episodes each; measured with
    # --seeds 5, 1-2 min a seed at one thread
    "asct_lm_vs_ppo": ("asct_vs_ppo", ["--steps", "20", "--set", "asct.episodes=8", "--set", "asct.n_sim=8", "--set", "asct.n_heldout=60",
                                       "--set", "asct.lm.sft_steps=30", "--set", "model.hidden_size=32", "--set", "model.intermediate_size=64",
                                       "--set", "asct.eval_samples=4"]),
    # 3 objects, 1-2 hops; SFT 2000 steps of 32 at lr 0.002 on 20,000 scenes, then 20 RL steps of 4 questions x G=8 at
    # lr 1e-3 (12 steps at 3e-4 changed no greedy answer). Issue 34: 200 steps at lr 0.003 on 2,000 scenes left the VLM
    # at chance (0.28-0.33); 3000 steps of 16 at lr 0.006 passed the premise on seed 0 only (0.48; 0.29, 0.43, 0.27): a
    # seed-1 probe sat at chance (loss 0.43, the KG's anchor object not even copied from the question) for 3000 steps
    # and broke through only after (0.44 at 4000), while at lr 0.002 x 32 it reached 0.47 at 1000 steps and 0.60 at
    # 3000. About 30 min a seed as one of five 1-thread jobs on 2 cores, most of it the two SFTs; measured with
    # --seeds 5 (seeds 0-1, 2-3 and 4 as three processes, merged)
    "viskg_gdpo_vs_grpo": ("viskg_gdpo_vs_grpo", ["--steps", "20", "--set", "viskg.data.n_objects=3", "--set", "viskg.data.max_hops=2",
                                                  "--set", "viskg.data.n_train=20000", "--set", "viskg.data.n_heldout=100",
                                                  "--set", "viskg.sft.steps=2000", "--set", "viskg.sft.batch_size=32", "--set", "viskg.sft.lr=0.002",
                                                  "--set", "viskg.rl.prompts_per_step=4", "--set", "viskg.rl.lr=0.001",
                                                  "--set", "viskg.rl.max_new_tokens=100", "--set", "viskg.eval.max_new_tokens=100"]),
    "dsp_vs_baselines": ("dsp_vs_baselines", ["--steps", "2000"]),  # measured with --seeds 5
    # a real checkpoint (SmolLM2-135M-Instruct) on 2 shared CPU cores: examples/smollm2/params.yaml's budget
    "smollm2_rl": ("smollm2_rl", []),
    "smollm2_sft_rl": ("smollm2_sft_rl", []),  # the same, after 40 SFT steps on worked solutions
    "smollm2_sft_rl_low_lr": ("smollm2_sft_rl", ["--rl-lr", "5e-6"]),  # the same SFT starts, RL at a quarter of the lr
    # GRPO, Dr. GRPO, DAPO, GSPO, MaxRL, ReMax and QGLAS at smollm2_rl's budget, against GRPO and the example's arm
    # grpo and dr_grpo measured 2026-12-06, dapo and gspo 2026-12-07, max_rl, remax, qglas in later sessions (earlier arms read back)
    "smollm2_objectives": ("smollm2_objectives", ["--arms", "qglas", "--recorded-arms", "grpo,dr_grpo,dapo,gspo,max_rl,remax"]),
    # the samplers on the real checkpoint, no training: 30 of the 200 held-out problems a seed (disjoint slices), one
    # thread per seed, the seeds as parallel processes (merged)
    "smollm2_samplers": ("smollm2_samplers", ["--prompts", "30", "--threads", "1", "--no-mlflow"]),
    # TTSD's reward as a pick over 8 temperature samples (smollm2_samplers' problem slices), one thread per seed
    "smollm2_ttsd_reward": ("smollm2_ttsd_reward", ["--prompts", "30", "--threads", "1", "--no-mlflow"]),
    # SIPO and OPSD at smollm2_objectives' budget from the same import (example and grpo rows read back, not re-run)
    "smollm2_sipo": ("smollm2_self_distill", ["--arms", "sipo", "--threads", "1"]),
    "smollm2_opsd": ("smollm2_self_distill", ["--arms", "opsd", "--threads", "1"]),
    "samplers_arithmetic": ("samplers_compare", ["--dataset", "arithmetic", "--steps", "200", "--prompts", "200"]),
    "samplers_word_problems": ("samplers_compare", ["--dataset", "word_problems", "--steps", "60", "--prompts", "100", "--chunk", "25",
                                                    "--max-votes", "32"]),
    # CrossTimeEdit at recipes/image/params.yaml's budget: per seed a 600-step flow_sft model, then 40 Flow-GRPO steps per
    # arm, judged on 64 held-out edits x 2 samples; _one_sft: the SFT model of seed 0 for every seed (RL and evaluation
    # noise alone)
    "flow_gdpo_vs_sum": ("flow_gdpo_vs_sum", []),
    "flow_gdpo_vs_sum_one_sft": ("flow_gdpo_vs_sum", ["--sft-seed", "0"]),
    # the same 100 updates of 32 prompts x 8 attempts per arm; retrospections at the spec's lower temperature (0.7-1.0); a start SFT'd 900 steps (off the ceiling)
    "roft_vs_grpo": ("roft_vs_grpo", ["--steps", "100", "--set", "rl.options.roft.temperature=0.7", "--set", "sft.steps=900"]),
}


def load_module(script: str):
    spec = importlib.util.spec_from_file_location(f"claim_{script}", HERE / f"{script}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_claim(name: str, seeds: int, out_dir: Path, common: list[str], extra: list[str]) -> dict:
    from _claims import run_seeds

    script, flags = CLAIMS[name]
    argv = [*flags, *common, *extra, "--seeds", str(seeds), "--json", str(out_dir / f"{name}.json")]
    module = load_module(script)  # a script's `claim_figure(per_seed)`, if it has one, goes to the claim's MLflow parent run
    results = run_seeds(module.main, name, argv, script=str(HERE / f"{script}.py"), figure=getattr(module, "claim_figure", None))
    return results


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--claim", action="append", choices=sorted(CLAIMS), help="a claim to run (repeatable)")
    which.add_argument("--all", action="store_true", help="every claim")
    which.add_argument("--list", action="store_true", help="print each claim and its command")
    which.add_argument("--merge", nargs="+", type=Path, help="one claim's results JSONs from runs on different seeds")
    which.add_argument("--resummarise", action="store_true",
                       help="recompute every results JSON's comparisons and premises from its per-seed results (no run)")
    p.add_argument("--json", type=Path, default=None, help="--merge: where the merged results go")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--out-dir", type=Path, default=HERE / "results")
    p.add_argument("--micro", action="store_true", help="micro budget (smoke tests; numbers are meaningless)")
    p.add_argument("--no-mlflow", action="store_true")
    p.add_argument("--tracking-uri", default=None)
    args = p.parse_args(argv)
    if args.merge:
        from _claims import merge

        if args.json is None:
            p.error("--merge needs --json OUT")
        missing = [str(f) for f in args.merge if not f.is_file()]
        if missing:
            p.error(f"no such results file: {', '.join(missing)}")
        merged = merge([json.loads(f.read_text()) for f in args.merge], args.json.resolve())
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(merged, indent=2) + "\n")
        print(f"wrote {args.json}")
        return 0
    if args.resummarise:
        from _claims import premise_table, summarise

        for path in sorted(args.out_dir.glob("*.json")):
            data = json.loads(path.read_text())
            if "per_seed" not in data:
                continue
            data["comparisons"] = summarise(data["claim"], data["per_seed"], data["seeds"])
            data["premises"] = premise_table(data["claim"], data["per_seed"], data["seeds"])
            path.write_text(json.dumps(data, indent=2) + "\n")
            print(f"{path.name}: " + "; ".join(f"{r['metric']} {r['better']} vs {r['worse']}: {r['verdict']}" for r in data["comparisons"]))
        return 0
    if args.list:
        for name, (script, flags) in CLAIMS.items():
            print(f"{name}: .venv/bin/python experiments/{script}.py {shlex.join(flags)} --seeds {args.seeds}")
        return 0
    common = (["--micro"] if args.micro else []) + (["--no-mlflow"] if args.no_mlflow else []) + \
        (["--tracking-uri", args.tracking_uri] if args.tracking_uri else [])
    verdicts = {}
    for name in (list(CLAIMS) if args.all else args.claim):
        results = run_claim(name, args.seeds, args.out_dir, common, extra)
        verdicts[name] = [f"{r['metric']} {r['better']} vs {r['worse']}: {r['verdict']}" for r in results["comparisons"]]
    print("\n" + "\n".join(f"{n}: " + "; ".join(v) for n, v in verdicts.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
