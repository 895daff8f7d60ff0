"""Claim: on CrossTimeEdit's three judges (IA, BP, QP), GDPO (per-judge group normalisation, then sum;
github.com/NVlabs/GDPO) improves the overall score mean(IA, BP, QP) at least as much as sum_then_normalize (GRPO on the
summed judges) on the same Flow-GRPO budget (CrossTimeEdit's setting).

Both arms start from the same flow_sft model with the same seed and settings (`flow_rl` in recipes/image/params.yaml,
only `flow_rl.advantage` differs) and are judged on the same held-out edits from the same initial noise.

    .venv/bin/python experiments/flow_gdpo_vs_sum.py --data outputs/images/curate --sft outputs/images/flow_sft \\
        --json outputs/claims/flow_gdpo_vs_sum.json [--steps N] [--params recipes/image/params.yaml] [--set key=value ...]

Prints a table (overall and each judge, SFT and both arms, relative change in %), writes JSON, and logs one
MLflow run per arm in the experiment `claims`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from posttrain import resolve
from posttrain.recipes.image.vigor.edits import load_edits
from posttrain.recipes.image.eval import judge_edits
from posttrain.recipes.image.flow import load_flow_model
from posttrain.tracking import stage_run
from posttrain.recipes.image.grpo import train_flow_rl

ARMS = ("gdpo", "sum_then_normalize")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("outputs/images/curate"))
    parser.add_argument("--sft", type=Path, default=Path("outputs/images/flow_sft"))
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--params", type=Path, default=Path("recipes/image/params.yaml"))
    parser.add_argument("--steps", type=int, default=None, help="flow_rl.steps (default: the params file)")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args()
    overrides = [*args.overrides, "pipeline.name=claims"] + ([f"flow_rl.steps={args.steps}"] if args.steps else [])
    torch.set_num_threads(1)

    cfg = resolve.load(args.params, overrides)
    train = load_edits(args.data, "train", cfg.flow.image_size)
    heldout = load_edits(args.data, "heldout", cfg.flow.image_size)
    heldout = heldout.take(list(range(min(cfg.flow_eval.n_prompts, len(heldout)))))
    batch = heldout.take(torch.arange(len(heldout)).repeat_interleave(cfg.flow_eval.samples_per_prompt))

    def judge(model) -> dict[str, float]:
        scores, names, _ = judge_edits(model.eval(), batch, cfg.flow_rl.rewards, cfg.flow_eval.sampling_steps, cfg.pipeline.seed)
        return {**{n: float(scores[:, k].mean()) for k, n in enumerate(names)}, "overall": float(scores.mean())}

    results = {"sft": judge(load_flow_model(args.sft / "model"))}
    for arm in ARMS:
        arm_cfg = resolve.load(args.params, [*overrides, f"flow_rl.advantage={arm}"])
        torch.manual_seed(arm_cfg.pipeline.seed)
        model = load_flow_model(args.sft / "model")
        with stage_run(arm_cfg, f"claim:flow_{arm}", "experiment") as tracker:
            train_flow_rl(model, train, arm_cfg.flow_rl, arm_cfg.pipeline.seed, on_log=lambda step, m: tracker.log_metrics(m, step))
            results[arm] = judge(model)
            results[arm]["overall_change_pct"] = 100 * (results[arm]["overall"] - results["sft"]["overall"]) / results["sft"]["overall"]
            tracker.log_metrics({f"heldout_{k}": v for k, v in results[arm].items()})

    judges = [k for k in results["sft"] if k != "overall"] + ["overall"]
    print(f"{'':22}" + "".join(f"{j:>10}" for j in judges) + f"{'change %':>10}")
    for name, row in results.items():
        change = f"{row['overall_change_pct']:+10.2f}" if "overall_change_pct" in row else f"{'':>10}"
        print(f"{name:22}" + "".join(f"{row[j]:10.4f}" for j in judges) + change)
    payload = {"steps": cfg.flow_rl.steps, "n_heldout_edits": len(heldout), "results": results,
               "gdpo_minus_sum_overall": results["gdpo"]["overall"] - results["sum_then_normalize"]["overall"]}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(payload, indent=2) + "\n")


if __name__ == "__main__":
    main()
