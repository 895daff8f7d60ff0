"""Claim: the objectives users compare first (GRPO, Dr. GRPO, DAPO, GSPO, MaxRL, ReMax, QGLAS) on a real checkpoint,
SmolLM2-135M-Instruct, at one task and budget: examples/smollm2's RL straight from the import
(experiments/smollm2_rl.py: 20 steps of 8 prompts x 8 samples, 48 new tokens, lr 2e-5), each arm that budget with its
method's `rl` keys on top.

The arms (each from the same import, problems and seeds as smollm2_rl):

    example   examples/smollm2's own objective: the clipped surrogate, token-mean loss, advantages NOT divided by the
              group's std (read from experiments/results/smollm2_rl.json, arm `rl`: the same stages, settings and
              seeds; not run again here)
    grpo      GRPO as DeepSeekMath writes it: advantages divided by the group's std, the sequence-mean loss
    dr_grpo   the `dr_grpo` preset: no std division, the loss summed over tokens and divided by G x L_max
    dapo      the `dapo` preset: clip-higher, token-mean loss, dynamic sampling (all-equal groups dropped and refilled,
              up to 4 extra rollouts a step), the soft overlong reward; the example's no-std advantage kept
    gspo      the `gspo` preset: the sequence-level ratio clipped at 3e-4 / 4e-4, the sequence-mean loss
    max_rl    the example with MaxRL's advantage (prime-rl, SkyRL): (r - group mean) / group mean, so a prompt solved
              at rate p weighs ~1/p and an all-fail group carries nothing
    remax     the example with ReMax's advantage (verl): the reward minus the greedy completion's reward, so a group
              of equal sampled rewards still moves when the greedy answer scores differently (one greedy rollout
              per prompt and step on top)
    qglas     the example with QGLAS's advantage (seed method 21): a bounded bonus (<= 0.5) to the shorter of a group's
              positive-advantage answers, strongest when those answers are alike in reward; the claim: shorter
              completions at no cost in accuracy

CISPO is not an arm: with one optimizer step per rollout batch (rl.epochs_per_batch 1, as here and in TRL's default)
the ratio is 1 up to the sampler-trainer mismatch, so CISPO's clipped, detached weight is 1 and its gradient is the
example's token-mean policy gradient; for the same reason clip-higher changes nothing in `dapo` and GSPO's gradient is
the sequence-mean policy gradient. What separates the arms here is the advantage's scaling, the aggregation and DAPO's
sampling. The same holds for most of the catalogue's other losses here: SAPO's soft gate has slope 1 at ratio 1,
GMPO's geometric mean gives the sequence-mean gradient at ratio 1, and KL-Cov and Clip-Cov touch max(2e-4 of the
tokens, 1), about one token of a batch's ~3,000; RLOO and LitePPO rescale the example's advantage by a per-batch
constant that Adam's normalisation all but removes (REINFORCE++-baseline too, after a shift by the advantages'
token-weighted batch mean, small beside their spread). MaxRL and ReMax weigh the prompts differently, so they are
arms. The claim's premise checks that each arm's run differs from the example's (its
per-step completion length, `curve_gap`).

`--recorded-arms A,B` reads those arms' rows from this claim's recorded results
(experiments/results/smollm2_objectives.json, the same stages, settings and seeds) instead of running them, the way
`example` is read: the arms were measured in different sessions (grpo and dr_grpo in one, dapo and gspo in a later
one, max_rl in a third, remax and qglas in a fourth), each row says where it came from (`recorded_from`), and wall times compare only
between arms of one session.

Measured (experiments/claims.py's flags): 3 seeds; grpo and dr_grpo each arm-seed 15-47 minutes as one of two to
four 1-thread processes on 2 cores; dapo and gspo as two parallel 1-thread processes (their wall times in the table);
max_rl 21-24 minutes a seed as one of two; remax 22-24 minutes a seed as one of two; qglas 17-27 minutes a seed as
three processes on 2 cores (`--seed s --seeds 1` each, merged with experiments/claims.py --merge).

Per arm and seed the table row holds the eval stage's held-out metrics (`wp_*`), the RL history's mean entropy and
completion length over the last 5 steps, and the arm's wall time (RL + evaluation; the arms ran as parallel
1-thread processes, the example at 2 threads alone: compare wall times between arms of one session only).

    .venv/bin/python experiments/smollm2_objectives.py [--arms grpo,dr_grpo,dapo,gspo] [--recorded-arms A,B] [--threads N] [--work DIR] [--json FILE]

Arms can run as separate processes on one work directory (`--arms grpo --seeds 3` and `--arms dapo --seeds 3` side
by side); a final run with every arm then only collects their finished outputs.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import _claims as C
import smollm2_rl as base

REPO = Path(__file__).resolve().parents[1]
EXAMPLE_RESULTS = REPO / "experiments" / "results" / "smollm2_rl.json"
RECORDED = REPO / "experiments" / "results" / "smollm2_objectives.json"
ARMS: dict[str, list[str]] = {
    "grpo": ["--set", "rl.std_scaling=group", "--set", "rl.loss_agg=seq_mean"],
    "dr_grpo": ["--set", "rl.preset=dr_grpo"],
    "dapo": ["--set", "rl.preset=dapo"],
    "gspo": ["--set", "rl.preset=gspo"],
    "max_rl": ["--set", "rl.advantage=max_rl"],
    "remax": ["--set", "rl.advantage=remax"],
    "qglas": ["--set", "rl.advantage=qglas"],
}
LAST = 5  # steps whose entropy and completion length the row averages


def example_row(seed: int) -> dict:
    """The example's objective on `seed`: smollm2_rl's `rl` row, with its entropy-free history summary."""
    recorded = json.loads(EXAMPLE_RESULTS.read_text())
    one = next((s for s in recorded["per_seed"] if s["seed"] == seed), None)
    if one is None:
        raise SystemExit(f"{EXAMPLE_RESULTS.name} has no seed {seed} (its seeds: {recorded['seeds']}): run experiments/smollm2_rl.py on it first")
    row = next(r for r in one["table"] if r["arm"] == "rl")
    lengths = one["completion_length_curve"]
    return {**{k: v for k, v in row.items() if k.startswith("wp_")}, "arm": "example", "completion_length_last": sum(lengths[-LAST:]) / LAST,
            "entropy_last": float("nan"), "wall_seconds": one["seconds"]["rl"] + one["seconds"]["eval_rl"], "threads": one["threads"],
            "completion_length_curve": lengths, "train_accuracy_curve": one["train_accuracy_curve"],
            "final_train_accuracy": one["rl_metrics"]["final_train_accuracy"]}


def recorded_row(arm: str, seed: int) -> dict:
    """`arm`'s row on `seed` from this claim's recorded results (an arm measured in an earlier session)."""
    recorded = json.loads(RECORDED.read_text())
    one = next((s for s in recorded["per_seed"] if s["seed"] == seed), None)
    row = next((r for r in one["table"] if r["arm"] == arm), None) if one else None
    if row is None:
        raise SystemExit(f"{RECORDED.name} has no arm {arm!r} on seed {seed}: run it (--arms {arm}) instead of --recorded-arms")
    return {**row, "recorded_from": row.get("recorded_from", recorded["command"])}


def arm_row(arm: str, wp: dict, history: list[dict], wall_seconds: float, threads: int) -> dict:
    """An arm's table row: the eval stage's held-out metrics (`wp_*`), entropy and completion length over the last
    LAST steps, wall time, and the per-step curves."""
    last = history[-LAST:]
    return {
        "arm": arm, **{f"wp_{k}": v for k, v in wp.items()},
        "completion_length_last": sum(h["completion_length"] for h in last) / len(last),
        "entropy_last": sum(h.get("entropy", float("nan")) for h in last) / len(last),
        "wall_seconds": wall_seconds, "threads": threads,
        "completion_length_curve": [h["completion_length"] for h in history], "train_accuracy_curve": [h.get("accuracy") for h in history],
        "entropy_curve": [h.get("entropy") for h in history], "final_train_accuracy": history[-1].get("accuracy"),
    }


def curve_gap(result: dict, arm: str) -> float:
    """Mean absolute difference, in tokens, between `arm`'s and the example's per-step completion length over the run:
    0 when the arm sampled what the example sampled at every step (the same run under another name)."""
    curves = {r["arm"]: r["completion_length_curve"] for r in result["table"]}
    mine, theirs = curves[arm], curves["example"]
    return sum(abs(a - b) for a, b in zip(mine, theirs)) / len(mine)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {', '.join(ARMS)}")
    p.add_argument("--recorded-arms", default="", help="arms read from the recorded results instead of run (see the docstring)")
    p.add_argument("--threads", type=int, default=None, help="pipeline.threads for this process (default: the example's 2)")
    p.add_argument("--work", type=Path, default=REPO / "outputs" / "claims" / "smollm2_objectives")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    arms = [a for a in args.arms.split(",") if a]
    recorded_arms = [a for a in args.recorded_arms.split(",") if a]
    unknown = sorted(set(arms + recorded_arms) - set(ARMS))
    if unknown:
        raise SystemExit(f"--arms: unknown {unknown}; known: {sorted(ARMS)}")
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    shared = ["--set", f"tracking.uri=sqlite:///{work}/mlflow.db", "--set", f"tracking.artifact_root={work}/mlartifacts",
              # the RL stage's own held-out checks and checkpoints are off: the eval stage measures the result, and
              # neither changes the run (make run's seed 0 at eval_every 10 equals smollm2_rl's at 5, figure for figure)
              "--set", "rl.eval_every=0", "--set", "rl.checkpoint_every=0",
              *(["--set", f"pipeline.threads={args.threads}"] if args.threads else [])]
    paths = base.rl_from_checkpoint(work)
    base.stage("import", "--out", "import", overrides=[*shared, *paths, "--set", "pipeline.seed=0"], cwd=work)
    base.stage("data", "--out", "data", overrides=[*shared, *paths, "--set", "pipeline.seed=0"], cwd=work)
    seeded = [*shared, *paths, "--set", f"pipeline.seed={args.seed}"]
    table = [example_row(args.seed), *(recorded_row(arm, args.seed) for arm in recorded_arms if arm not in arms)]
    for arm in arms:
        run = f"seed{args.seed}/{arm}"
        _, rl_seconds = base.stage("rl", "--in", "data=data", "--in", "policy=import", "--out", f"{run}/rl", overrides=[*seeded, *ARMS[arm]], cwd=work)
        wp, eval_seconds = base.stage("eval", "--in", "data=data", "--in", f"model={run}/rl", "--out", f"{run}/eval", overrides=seeded, cwd=work)
        history = json.loads((work / run / "rl" / "history.json").read_text())
        table.append(arm_row(arm, wp, history, rl_seconds + eval_seconds, args.threads or 2))
    arms = [*(a for a in recorded_arms if a not in arms), *arms]
    results = {"checkpoint": base.CHECKPOINT, "seed": args.seed, "arms": arms, "example_source": str(EXAMPLE_RESULTS.relative_to(REPO)),
               "table": table}
    results["completion_length_gap"] = {arm: curve_gap(results, arm) for arm in arms}
    for row in table:
        print(row["arm"], {k: round(v, 3) for k, v in row.items() if isinstance(v, float) and (k.startswith("wp_greedy_acc") or k in (
            "completion_length_last", "entropy_last", "wall_seconds"))}, flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    C.run_seeds(main, "smollm2_objectives")
