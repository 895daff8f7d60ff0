"""Claim: SIPO and OPSD, whose teacher is the policy itself told the reference answer, on a real checkpoint
(SmolLM2-135M-Instruct) at smollm2_objectives' task and budget: examples/smollm2's RL straight from the import (20 steps
of 8 prompts x 8 samples, 48 new tokens, lr 2e-5), each arm that budget with its method's `rl` keys on top.

The arms (each from the same import, problems and seeds as smollm2_rl and smollm2_objectives):

    example   the example's objective (no std division, token-mean clipped surrogate): read from
              experiments/results/smollm2_rl.json, arm `rl` (the same stages, settings and seeds; not run again)
    grpo      GRPO as DeepSeekMath writes it (std-scaled, sequence-mean), read from smollm2_objectives.json
    sipo      `rl.advantage=sipo`: the example's advantage plus SIPO's zero-mean token redistribution from the
              contrastive self-teacher (the reference marked right and up to 3 of the group's wrong answers marked
              wrong, against the labels swapped), lambda 0.3, clip 2; every other key the example's
    opsd      `rl.preset=opsd`: no policy gradient; the reverse KL from the policy to itself told the reference answer,
              over the student's own samples and the full vocabulary

The teachers read the natural framing of trainers/contexts.py (the problem, then "Answers to this problem, each marked
right or wrong: Right: #### 42 / Wrong: ..." or "A reference solution: #### 42", then "Now answer the problem
yourself."), rendered by the chat template with the task's system prompt. The reference is the problem's final answer
in the task's answer format (`#### 42`): RL straight from the checkpoint has no worked solutions.

Premises, per seed:
- the teacher reads the hint: the checkpoint's held-out greedy accuracy with the reference answer in its context
  minus without (`teacher_lead`; one measurement, the same checkpoint and problems for every seed), >= 0.10;
- SIPO's own signal in all-fail groups: the mean per-row token std of its advantage over the rows of groups whose
  correctness is 0 on every sample (`advantage/correctness_all_zero_spread`, over the steps that had such groups) > 0
  (a sequence-level advantage, the example's or GRPO's, is exactly 0 there);
- each arm's run differs from the example's: mean |per-step completion length difference| >= 0.25 tokens.

Measured 2026-12-07 (experiments/claims.py's flags, one 1-thread process per arm and seed, two to four at a time on
2 cores): sipo on seeds 0-2, 2,644-3,550 s each; opsd on seeds 0-2, 2,174-2,384 s each (it collapsed on every
seed, see docs/distillation.md).

Per arm and seed the row holds the eval stage's held-out metrics (`wp_*`), entropy and completion length over the
last 5 steps, the share of all-fail groups and the advantage they still carried, and the wall time (RL + eval).

    .venv/bin/python experiments/smollm2_self_distill.py [--arms sipo|opsd] [--threads N] [--work DIR] [--json FILE]

Each arm is its own claim (`smollm2_sipo`, `smollm2_opsd`: experiments/claims.py), so each reports on the seeds it was
measured on. Arms and seeds can run as separate processes on one work directory (`--seed 2 --seeds 1`); a final run
then only collects their finished outputs.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import _claims as C
import smollm2_objectives as objectives
import smollm2_rl as base

REPO = Path(__file__).resolve().parents[1]
ARMS: dict[str, list[str]] = {
    "sipo": ["--set", "rl.advantage=sipo"],
    "opsd": ["--set", "rl.preset=opsd"],
}
RECORDED_ARMS = ("grpo",)  # read from smollm2_objectives' recorded results


def teacher_lead(work: Path, overrides: list[str], threads: int) -> dict:
    """The checkpoint's held-out greedy accuracy on the eval stage's problems, plain and with the reference answer in
    its context (trainers/contexts.answer_context, natural framing, system prompt kept); cached in `work`."""
    cached = work / "teacher_lead.json"
    if cached.is_file():
        return json.loads(cached.read_text())
    import torch

    from posttrain import resolve
    from posttrain.data import read_examples
    from posttrain.eval.harness import greedy_metrics
    from posttrain.models import load_pretrained, prepare_model
    from posttrain.models.chat import uses_chat
    from posttrain.tasks import build_task
    from posttrain.trainers import contexts

    torch.set_num_threads(threads)
    cfg = resolve.load(base.PARAMS, [o for o in overrides if o != "--set"])
    model, tokenizer = load_pretrained(work / "import" / "model", cfg.model.dtype)
    model = prepare_model(model, tokenizer, cfg.model, torch.device("cpu"), train=False)
    assert uses_chat(tokenizer), "the natural framing is for a chat model"
    task = build_task(cfg.task)
    examples = read_examples(work / "data" / "heldout.jsonl")[: cfg.eval.n_prompts]
    told = [replace(e, prompt=contexts.answer_context(e, natural=True)) for e in examples]
    args = (cfg.eval.max_new_tokens, tuple(cfg.eval.stop), cfg.eval.batch_size)
    plain = greedy_metrics(model, tokenizer, task, examples, *args)["greedy_accuracy"]
    hinted = greedy_metrics(model, tokenizer, task, told, *args)["greedy_accuracy"]
    result = {"n": len(examples), "plain": plain, "with_reference": hinted, "lead": hinted - plain,
              "example_context": told[0].prompt}
    cached.write_text(json.dumps(result, indent=2) + "\n")
    return result


def steps_mean(history: list[dict], key: str, where: str | None = None) -> float:
    """Mean of `key` over the steps (those where `where` > 0, when given); nan when none."""
    values = [h[key] for h in history if key in h and (where is None or h.get(where, 0) > 0)]
    return sum(values) / len(values) if values else math.nan


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--arms", default="sipo", help=f"one of {', '.join(ARMS)} (each is its own claim: smollm2_<arm>)")
    p.add_argument("--threads", type=int, default=None, help="pipeline.threads for this process (default: the example's 2)")
    p.add_argument("--work", type=Path, default=REPO / "outputs" / "claims" / "smollm2_objectives")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    arms = [a for a in args.arms.split(",") if a]
    unknown = sorted(set(arms) - set(ARMS))
    if unknown:
        raise SystemExit(f"--arms: unknown {unknown}; known: {sorted(ARMS)}")
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    shared = ["--set", f"tracking.uri=sqlite:///{work}/mlflow.db", "--set", f"tracking.artifact_root={work}/mlartifacts",
              "--set", "rl.eval_every=0", "--set", "rl.checkpoint_every=0",  # as smollm2_objectives: neither changes the run
              *(["--set", f"pipeline.threads={args.threads}"] if args.threads else [])]
    paths = base.rl_from_checkpoint(work)
    base.stage("import", "--out", "import", overrides=[*shared, *paths, "--set", "pipeline.seed=0"], cwd=work)
    base.stage("data", "--out", "data", overrides=[*shared, *paths, "--set", "pipeline.seed=0"], cwd=work)
    lead = teacher_lead(work, [*shared, *paths], args.threads or 2)
    print(f"teacher: held-out greedy {lead['plain']:.2f} plain, {lead['with_reference']:.2f} told the reference", flush=True)
    seeded = [*shared, *paths, "--set", f"pipeline.seed={args.seed}"]
    table = [objectives.example_row(args.seed), *(objectives.recorded_row(arm, args.seed) for arm in RECORDED_ARMS)]
    for arm in arms:
        run = f"seed{args.seed}/{arm}"
        _, rl_seconds = base.stage("rl", "--in", "data=data", "--in", "policy=import", "--out", f"{run}/rl", overrides=[*seeded, *ARMS[arm]], cwd=work)
        wp, eval_seconds = base.stage("eval", "--in", "data=data", "--in", f"model={run}/rl", "--out", f"{run}/eval", overrides=seeded, cwd=work)
        history = json.loads((work / run / "rl" / "history.json").read_text())
        table.append({
            **objectives.arm_row(arm, wp, history, rl_seconds + eval_seconds, args.threads or 2),
            "all_fail_groups": steps_mean(history, "reward/correctness_all_zero"),
            "all_fail_abs_advantage": steps_mean(history, "advantage/correctness_all_zero_abs", where="reward/correctness_all_zero"),
            "all_fail_token_spread": steps_mean(history, "advantage/correctness_all_zero_spread", where="reward/correctness_all_zero"),
            "opsd_divergence": steps_mean(history, "opsd/divergence"),
        })
    results = {"checkpoint": base.CHECKPOINT, "seed": args.seed, "arms": arms, "recorded_arms": list(RECORDED_ARMS),
               "example_source": str(objectives.EXAMPLE_RESULTS.relative_to(REPO)), "teacher": lead, "table": table}
    results["completion_length_gap"] = {arm: objectives.curve_gap(results, arm) for arm in arms}
    for row in table:
        print(row["arm"], {k: round(v, 3) for k, v in row.items() if isinstance(v, float) and (k.startswith("wp_greedy_acc") or k in (
            "completion_length_last", "entropy_last", "all_fail_groups", "all_fail_token_spread", "wall_seconds"))}, flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")


def claim_of(argv: list[str]) -> str:
    """One claim per arm, each on the seeds it was measured on: `smollm2_opsd` for `--arms opsd`, else `smollm2_sipo`."""
    arms = argv[argv.index("--arms") + 1] if "--arms" in argv else "sipo"
    if arms not in ARMS:
        raise SystemExit(f"--arms: one of {sorted(ARMS)} under the claims harness (each arm is its own claim), got {arms!r}")
    return f"smollm2_{arms}"


if __name__ == "__main__":
    C.run_seeds(main, claim_of(sys.argv[1:]))
