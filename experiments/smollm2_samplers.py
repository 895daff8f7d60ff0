"""Claim (issue 39): the inference-time samplers on a real checkpoint, SmolLM2-135M-Instruct, at measured compute.
PPT beats single-chain power sampling (also with power given PPT's forward tokens); TTSD beats temperature sampling
(one sample, and the majority vote at TTSD's compute) and beam search (width 4, and 12 = TTSD's rows per step). On the
tiny character models these samplers had 1-3-token answers to work on (MH acceptance 0.99, beam = wide beam); the
checkpoint writes its working before the answer (about 25-45 tokens).

No training: every arm decodes the imported checkpoint with experiments/smollm2_rl.py's import, problems and eval
settings (48 new tokens, the example's system prompt, the chat template). A seed is a draw of `--prompts` of the 200
held-out problems (a fixed permutation cut into slices: seed s takes slice s, so seeds 0-4 at 40 are disjoint) and
the samplers' random generator; the deterministic arms (greedy, beam, TTSD) vary over seeds through their problems,
and every comparison pairs two arms on the same problems. The arms and the compute matching are
samplers_compare.py's (`measure`); the sampled arms (temperature, the vote, best-of-N) run at T 0.7, the example's RL
temperature (at 1.0 the checkpoint samples almost no correct answers).

TTSD's contexts are the spec's templates (specs §6: c+ primes an exemplary, verified solution, c- a careless one)
written as an instruction before the problem in the user's turn, the system prompt kept (`CONTEXTS`).

Premises (experiments/_premises.py): the answers are long (greedy tokens per answer >= 16); TTSD's rows need the
contexts to move the checkpoint (greedy accuracy under c+ minus under c-: its reward is their log-odds); the power
and PPT rows need their chains to move (MH acceptance <= 0.9).

    .venv/bin/python experiments/smollm2_samplers.py [--prompts 40] [--threads N] [--work DIR] [--seeds 3] [--json FILE]
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402
import samplers_compare as samplers  # noqa: E402
import smollm2_rl as base  # noqa: E402

CONTEXTS = ("Write an exemplary, carefully verified solution, as an expert would.\n\n",
            "Write a careless solution that contains reasoning errors.\n\n")
DRAW_SEED = 1234  # the permutation of the held-out problems that the seeds' slices cut


def problems(examples: list, prompts: int, seed: int) -> list:
    """Seed `seed`'s slice of a fixed permutation of `examples`: disjoint across seeds while they fit."""
    order = random.Random(DRAW_SEED).sample(range(len(examples)), len(examples))
    if (seed + 1) * prompts > len(examples):
        raise SystemExit(f"--prompts {prompts}: seed {seed}'s slice ends past the {len(examples)} held-out problems")
    return [examples[i] for i in order[seed * prompts:(seed + 1) * prompts]]


def imported(args):
    """(config, the imported checkpoint ready to decode, its tokenizer, the task, seed `args.seed`'s slice of `args.prompts`
    held-out problems) on `args.threads` threads: the import and data stages run once in `args.work`, whose problems
    and import smollm2_objectives shares."""
    import torch

    from posttrain.data import read_examples
    from posttrain.models import load_pretrained, prepare_model
    from posttrain.tasks import build_task

    torch.set_num_threads(args.threads)
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    paths = base.rl_from_checkpoint(work)
    shared = ["--set", f"tracking.uri=sqlite:///{work}/mlflow.db", "--set", f"tracking.artifact_root={work}/mlartifacts",
              "--set", f"pipeline.threads={args.threads}", "--set", "pipeline.seed=0"]
    base.stage("import", "--out", "import", overrides=[*shared, *paths], cwd=work)
    base.stage("data", "--out", "data", overrides=[*shared, *paths], cwd=work)
    cfg = C.load_config(args, [o for o in [*shared, *paths] if o != "--set"])
    model, tok = load_pretrained(work / "import" / "model", cfg.model.dtype)
    model = prepare_model(model, tok, cfg.model, torch.device("cpu"), train=False)
    held = problems(read_examples(work / "data" / "heldout.jsonl"), args.prompts, args.seed)
    return cfg, model, tok, build_task(cfg.task), held


def main() -> None:
    args = C.parse_args(__doc__.split("\n")[0], 1, [  # (--steps: unused, no training)
        ("--prompts", int, 40, "held-out problems per seed"), ("--work", Path, base.REPO / "outputs" / "claims" / "smollm2_objectives",
                                                              "the import and problems (shared with smollm2_objectives)"),
        ("--threads", int, 2, "torch threads"), ("--temperature", float, 0.7, "the sampled arms' temperature"),
        *samplers.sampler_flags(k=4, chunk=20, max_votes=64),
    ], params=base.PARAMS)
    from posttrain.rollout.samplers import SampleRequest

    cfg, model, tok, task, held = imported(args)
    start = time.time()
    request = SampleRequest(cfg.eval.max_new_tokens, 1, args.temperature, tuple(cfg.eval.stop), args.chunk)
    arms = samplers.measure(model, tok, task, held, args, args.seed, request, CONTEXTS)
    table = [{"arm": arm, "accuracy": v["accuracy"], "forward_tokens": v["forward_tokens"]} for arm, v in arms.items()]
    text = C.print_table(f"SmolLM2-135M-Instruct, seed {args.seed}: accuracy and forward tokens per answer", table)
    results = {"seed": args.seed, "dataset": "word_problems", "checkpoint": base.CHECKPOINT, "prompts": len(held),
               "problems": [e.prompt for e in held], "contexts": list(CONTEXTS), "temperature": args.temperature,
               "threads": args.threads, "seconds": time.time() - start, "table": table, "arms": arms}
    if not args.no_mlflow:
        C.log_arm(cfg, "smollm2_samplers", [], {f"{r['arm']}_{k}": r[k] for r in table for k in ("accuracy", "forward_tokens")},
                  table, text)
    C.write_json(args, results)


if __name__ == "__main__":
    argv = sys.argv[1:]
    outcome = C.run_seeds(main, "smollm2_samplers", figure=samplers.claim_figure)
    if outcome and "--micro" not in argv:
        figure_path = base.REPO / "docs" / "samplers_accuracy_vs_compute_smollm2.png"
        samplers.figure(outcome["per_seed"]).savefig(figure_path, dpi=120)
        print(f"wrote {figure_path}")
