"""Claim: a short SFT warm-up on worked solutions, then GRPO, raises SmolLM2-135M-Instruct's held-out accuracy on
two-step word problems, where GRPO straight from the checkpoint does not (experiments/smollm2_rl.py).

GRPO from the instruct checkpoint finds correct two-step answers too rarely to learn them (4-5% greedy before and
after 20 steps). This experiment gives RL a start that writes both steps: `sft` on worked solutions in the reward's
format ("2 x 3 = 6, and 6 + 3 = 9 #### 9": the generator's `solution` column with its closing words replaced by
`#### N`), then the RL of smollm2_rl (lr 2e-5) from that checkpoint. Shared once: the problems (examples/word_problems,
held-out file fixed), `import`, `data` (the worked column as the SFT completion; RL and eval read only prompts and
answers), `data_arithmetic` and the evaluation of the checkpoint (`base`). Per seed: `sft` (`pipeline.seed` = the
seed: its batch order), its evaluation (`sft`), `rl` from it and the evaluation of the result (`sft_rl`), on the word
problems (one- and two-step apart) and on reasoning-gym arithmetic.

Premise (experiments/_premises.py): RL's own gain on two-step problems needs a start that solves some of them, so
the `sft_rl` vs `sft` rows count only seeds whose SFT start is above the floor on two-step problems.

With `--rl-lr X` the RL runs at that learning rate instead of the example's (claim `smollm2_sft_rl_low_lr`), reusing
the shared outputs and the seeds' SFT checkpoints of a run in the same `--work`: does a gentler RL add to the SFT start?
(examples/smollm2, which runs SFT -> RL, took 5e-6: it no longer lowers the SFT start's accuracy.)

    .venv/bin/python experiments/smollm2_sft_rl.py [--sft-steps N] [--rl-lr X] [--steps N] [--work DIR] [--set key=value ...] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import _claims as C
from smollm2_rl import ARITHMETIC, CHECKPOINT, REPO, RL_LR, stage

SFT = ["--set", "sft.batch_size=8", "--set", "sft.n_examples=0", "--set", "sft.checkpoint_every=1000"]


def claim_of(argv: list[str]) -> str:
    """`smollm2_sft_rl_low_lr` when the command sets the RL's learning rate (`--rl-lr`), else `smollm2_sft_rl`."""
    return "smollm2_sft_rl_low_lr" if "--rl-lr" in argv else "smollm2_sft_rl"


def problems(work: Path) -> None:
    """The word problems of smollm2_rl (same generator, sizes and seed), each row with its `worked` column."""
    out = work / "problems"
    if (out / "heldout.jsonl").is_file() and "worked" in (out / "heldout.jsonl").read_text().splitlines()[0]:
        return
    subprocess.run([sys.executable, str(REPO / "examples/word_problems/generate.py"), "--out", str(out), "--n-train", "2000",
                    "--n-heldout", "200", "--seed", "0", "--answer-format", "#### {answer}"], check=True)


def evaluate(model: str, out: str, overrides: list[str], work: Path) -> tuple[dict, dict, float]:
    """The word problems' and arithmetic's eval of `model`: (word-problem metrics, arithmetic metrics, seconds)."""
    wp, wp_s = stage("eval", "--in", "data=data", "--in", f"model={model}", "--out", f"{out}/eval", overrides=overrides, cwd=work)
    ar, ar_s = stage("eval", "--in", "data=data_arithmetic", "--in", f"model={model}", "--out", f"{out}/eval_arithmetic",
                     overrides=[*overrides, *ARITHMETIC], cwd=work)
    return wp, ar, wp_s + ar_s


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sft-steps", type=int, default=40, help="SFT steps of 8 worked solutions (default 40: 320 solutions)")
    p.add_argument("--sft-lr", type=float, default=2e-5)
    p.add_argument("--rl-lr", type=float, default=None, help=f"rl.lr (default {RL_LR:g}: the RL measured straight from the checkpoint)")
    p.add_argument("--steps", type=int, default=None, help="rl.steps (default: examples/smollm2/params.yaml's)")
    p.add_argument("--work", type=Path, default=REPO / "outputs" / "claims" / "smollm2_sft_rl")
    p.add_argument("--set", dest="overrides", action="append", default=[], help="section.key=value, for every stage")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    problems(work)
    sets = [x for o in args.overrides for x in ("--set", o)] + (["--set", f"rl.steps={args.steps}"] if args.steps else [])
    shared = [*sets, "--set", f"tracking.uri=sqlite:///{work}/mlflow.db", "--set", f"tracking.artifact_root={work}/mlartifacts",
              "--set", f"task.options.dataset.path={work}/problems/train.jsonl",
              "--set", f"task.options.dataset.heldout_path={work}/problems/heldout.jsonl"]
    base = [*shared, "--set", "pipeline.seed=0"]
    seconds: dict[str, float] = {}
    _, seconds["import"] = stage("import", "--out", "import", overrides=base, cwd=work)
    _, seconds["data"] = stage("data", "--out", "data", overrides=[*base, "--set", "task.options.dataset.fields.completion=worked"], cwd=work)
    _, seconds["data_arithmetic"] = stage("data", "--out", "data_arithmetic", overrides=[*base, *ARITHMETIC], cwd=work)
    wp_base, ar_base, seconds["eval_base"] = evaluate("import", "base", base, work)

    run = f"seed{args.seed}"
    seeded = [*shared, "--set", f"pipeline.seed={args.seed}"]
    sft_sets = [*SFT, "--set", f"sft.steps={args.sft_steps}", "--set", f"sft.lr={args.sft_lr}", "--set", f"model.path={work}/import/model"]
    sft, seconds["sft"] = stage("sft", "--in", "data=data", "--out", f"{run}/sft", overrides=[*seeded, *sft_sets], cwd=work)
    wp_sft, ar_sft, seconds["eval_sft"] = evaluate(f"{run}/sft", f"{run}/sft", seeded, work)
    rl_out = f"{run}/rl" if args.rl_lr is None else f"{run}/rl_lr{args.rl_lr:g}"
    rl_sets = ["--set", f"rl.lr={RL_LR if args.rl_lr is None else args.rl_lr}"]
    rl, seconds["rl"] = stage("rl", "--in", "data=data", "--in", f"policy={run}/sft", "--out", rl_out, overrides=[*seeded, *rl_sets], cwd=work)
    wp_rl, ar_rl, seconds["eval_rl"] = evaluate(rl_out, rl_out, seeded, work)

    history = json.loads((work / rl_out / "history.json").read_text())
    table = [{"arm": name, **{f"wp_{k}": v for k, v in wp.items()}, **{f"ar_{k}": v for k, v in ar.items()}}
             for name, wp, ar in (("base", wp_base, ar_base), ("sft", wp_sft, ar_sft), ("sft_rl", wp_rl, ar_rl))]
    results = {
        "checkpoint": CHECKPOINT, "seed": args.seed, "sft_steps": args.sft_steps, "sft_lr": args.sft_lr, "rl_lr": args.rl_lr, "table": table,
        "sft_metrics": sft, "rl_metrics": rl, "seconds": seconds,
        "wall_seconds_sft_rl_and_eval": seconds["sft"] + seconds["rl"] + seconds["eval_rl"],
        "rl_seconds_per_step": seconds["rl"] / max(len(history), 1), "threads": os.environ.get("OMP_NUM_THREADS"),
        "train_accuracy_curve": [h.get("accuracy") for h in history],
        "completion_length_curve": [h.get("completion_length") for h in history],
    }
    print(json.dumps({k: v for k, v in results.items() if k != "table"}, indent=1), flush=True)
    for row in table:
        print(row["arm"], {k: round(v, 3) for k, v in row.items() if k != "arm" and ("accuracy" in k or "format" in k)})
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    C.run_seeds(main, claim_of(sys.argv[1:]))
