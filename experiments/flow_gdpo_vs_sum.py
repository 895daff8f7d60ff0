"""Claim (CrossTimeEdit, seed method 1): Flow-GRPO on the three image judges (IA, BP, QP) raises the SFT flow model's
overall score mean(IA, BP, QP) on held-out edits, and GDPO (per-judge group normalisation, then sum;
github.com/NVlabs/GDPO) raises it at least as much as sum_then_normalize (GRPO on the summed judges).

The image pipeline of recipes/image/params.yaml (docs/images.md), after curation. Arms per seed:

    sft                  the flow_sft model (the stage's settings: 600 flow-matching steps of 32 edits)
    gdpo                 flow_rl from that SFT model, flow_rl.advantage=gdpo (the recipe's default)
    sum_then_normalize   the same flow_rl, flow_rl.advantage=sum_then_normalize: nothing else differs

each judged (flow_eval's judging: the deterministic Euler sampler) on the same held-out edits x
flow_eval.samples_per_prompt samples from the same initial noise: the overall score and each judge.

What a seed varies: everything after curation. Seed s trains the SFT model (its initialisation, batches and
flow-matching noise) with seed s, runs both RL arms from it with RL seed s (the edits drawn each step and the SDE
noise: the same for both arms), and draws the evaluation noise from seed s. With `--sft-seed S` every seed starts from
the SFT model of seed S (claim `flow_gdpo_vs_sum_one_sft`): the spread of RL and evaluation noise alone. The synthetic
city and its curation (stages city and curate) are built once, with the pipeline's seed 0 (the data docs/images.md
describes), and cached with the SFT models under $POSTTRAIN_EXP_CACHE (default /tmp/posttrain_experiments).

Cost, on the shared 2-core CPU at one torch thread with other jobs running: measured first at load average 5-6, one
flow_sft model took 294-408 s and one 40-step flow_rl arm 188 s; in the claims' runs (load average about 4) a flow_sft
model took 100-109 s, a flow_rl arm 46-67 s and judging 64 held-out edits x 2 samples about 2 s per model, so 2-4
minutes a seed at the recipe's full budget, which is what the claims run (no steps or edits cut). An SFT model found in
the cache is not trained again (its `train_seconds` read 0).

Premises, per seed (experiments/_premises.py): each RL arm's parameters moved off the SFT model and the two RL arms off
each other (relative L2 distance), their images from the same noise differ (mean absolute pixel difference), and
every judge's SFT score is off its floor and its ceiling.

    .venv/bin/python experiments/flow_gdpo_vs_sum.py [--sft-seed S] [--steps N] [--seeds 3] [--json FILE] [--micro] [--set key=value ...]

`--steps` is flow_rl.steps (default 40, the recipe's); `--set` takes any section.key of recipes/image/params.yaml.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

import _common as C
from posttrain import resolve
from posttrain.recipes.image.eval import judge_edits
from posttrain.recipes.image.flow import load_flow_model, save_flow_model, start_flow_model
from posttrain.recipes.image.grpo import train_flow_rl
from posttrain.recipes.image.sft import train_flow_sft
from posttrain.recipes.image.vigor.edits import load_edits
from posttrain.runtime import seed_everything
from posttrain.stages import execute

PARAMS = C.REPO / "recipes" / "image" / "params.yaml"
RL_ARMS = ("gdpo", "sum_then_normalize")
DATA_SEED = 0  # the city and its curation: built once, whatever the seed
# --micro: a small city, a few SFT / RL steps, a few held-out edits (smoke tests; the numbers are meaningless)
MICRO = ["city.n_locations=60", "flow_sft.steps=4", "flow_sft.batch_size=8", "flow_rl.prompts_per_step=2", "flow_rl.group_size=2",
         "flow_rl.sampling_steps=4", "flow_eval.sampling_steps=4", "flow_eval.n_prompts=4"]


def claim_of(argv: list[str]) -> str:
    """The claim a command line runs: `flow_gdpo_vs_sum` (an SFT model per seed), or with `--sft-seed`
    `flow_gdpo_vs_sum_one_sft` (one SFT model for every seed)."""
    return "flow_gdpo_vs_sum_one_sft" if any(a == "--sft-seed" or a.startswith("--sft-seed=") for a in argv) else "flow_gdpo_vs_sum"


def curated(data_cfg) -> Path:
    """curate's output for the city of `DATA_SEED` (stages city and curate, run once per their settings)."""
    root = C.CACHE / f"flow_data_{data_cfg.section_hash('city', 'curate')}_s{DATA_SEED}"
    for stage, inputs in (("city", {}), ("curate", {"source": root / "city"})):
        if not (root / stage / "metrics.json").exists():
            execute(stage, data_cfg, inputs, root / stage, launcher="experiments")
    return root / "curate"


def sft_model(cfg, train, seed: int) -> tuple[Path, float]:
    """(the flow_sft model trained with `seed` on the curated training edits, the seconds it took when trained now);
    cached per settings and seed."""
    path = C.CACHE / f"flow_sft_{cfg.section_hash('city', 'curate', 'flow', 'flow_sft')}_s{seed}"
    if (path / "done").exists():
        return path, 0.0
    start = time.time()
    seed_everything(seed)
    model = start_flow_model(cfg.flow, cfg.flow.image_size)
    train_flow_sft(model, train, cfg.flow_sft, seed, on_log=lambda step, m: None)
    save_flow_model(model, path)
    (path / "done").write_text("ok")
    return path, time.time() - start


def relative_distance(model, reference) -> float:
    """||theta - theta_ref|| / ||theta_ref|| over every parameter: how far training moved `model` from `reference`."""
    ref = dict(reference.named_parameters())
    diff = sum(float((p.detach() - ref[n].detach()).pow(2).sum()) for n, p in model.named_parameters())
    return (diff / sum(float(p.detach().pow(2).sum()) for p in ref.values())) ** 0.5


def main() -> None:
    args = C.parse_args(__doc__.split("\n")[0], 40, [("--sft-seed", int, None, "the seed of the SFT model every seed starts from "
                                                                                 "(default: each seed trains its own)")], params=PARAMS)
    t0 = time.time()
    image = [f"flow_rl.steps={args.steps}", "flow_rl.checkpoint_every=0", "pipeline.threads=1", *(MICRO if args.micro else [])]
    cfg = C.load_config(args, image)
    data_cfg = resolve.load(args.params, [*image, *args.set, f"pipeline.seed={DATA_SEED}", "tracking.enabled=false"])
    data = curated(data_cfg)
    train = load_edits(data, "train", cfg.flow.image_size)
    heldout = load_edits(data, "heldout", cfg.flow.image_size)
    heldout = heldout.take(list(range(min(cfg.flow_eval.n_prompts, len(heldout)))))
    batch = heldout.take(torch.arange(len(heldout)).repeat_interleave(cfg.flow_eval.samples_per_prompt))
    sft_seed = args.seed if args.sft_seed is None else args.sft_seed
    sft_path, sft_seconds = sft_model(cfg, train, sft_seed)

    def judge(model) -> tuple[dict[str, float], torch.Tensor]:
        start = time.time()
        scores, names, images = judge_edits(model.eval(), batch, cfg.flow_rl.rewards, cfg.flow_eval.sampling_steps, args.seed)
        return {**{n: float(scores[:, k].mean()) for k, n in enumerate(names)}, "overall": float(scores.mean()),
                "eval_seconds": time.time() - start}, images

    sft = load_flow_model(sft_path)
    scores, images = {}, {}
    scores["sft"], images["sft"] = judge(sft)
    print(f"seed {args.seed}: SFT of seed {sft_seed} ({sft_seconds:.0f}s to train) overall {scores['sft']['overall']:.4f}", flush=True)
    models, arms = {}, {}
    for arm in RL_ARMS:
        rl_cfg = resolve.updated(cfg.flow_rl, "flow_rl", advantage=arm)
        seed_everything(args.seed)
        models[arm] = load_flow_model(sft_path)
        start = time.time()
        history = train_flow_rl(models[arm], train, rl_cfg, args.seed, on_log=lambda step, m: None)
        seconds = time.time() - start
        scores[arm], images[arm] = judge(models[arm])
        k = max(1, len(history) // 5)
        arms[arm] = {"heldout": scores[arm], "rl_seconds": round(seconds, 1),
                     "param_distance_from_sft": relative_distance(models[arm], sft),
                     "image_difference_from_sft": float((images[arm] - images["sft"]).abs().mean()),
                     "train_reward_first": C.window_mean(history, "reward/overall_mean", True, k),
                     "train_reward_last": C.window_mean(history, "reward/overall_mean", False, k),
                     "train_reward_curve": C.curve(history, "reward/overall_mean"),
                     "_history": history, "_cfg": cfg.model_copy(update={"flow_rl": rl_cfg})}
        print(f"{arm}: {seconds:.0f}s RL, overall {scores[arm]['overall']:.4f}, moved {arms[arm]['param_distance_from_sft']:.2e}", flush=True)
    between = {"param_distance": relative_distance(models["gdpo"], models["sum_then_normalize"]),
               "image_difference": float((images["gdpo"] - images["sum_then_normalize"]).abs().mean())}
    rows = [{"arm": a, **{j: v for j, v in scores[a].items() if j != "eval_seconds"},
             "change_pct": 100 * (scores[a]["overall"] - scores["sft"]["overall"]) / scores["sft"]["overall"],
             "param_distance": arms[a]["param_distance_from_sft"] if a in arms else 0.0,
             "train_seconds": arms[a]["rl_seconds"] if a in arms else round(sft_seconds, 1)} for a in ("sft", *RL_ARMS)]
    text = C.print_table(f"\nCrossTimeEdit Flow-GRPO, {args.steps} steps, {len(heldout)} held-out edits x {cfg.flow_eval.samples_per_prompt}", rows)
    runs = {}
    if cfg.tracking.enabled:
        for a in RL_ARMS:
            final = {f"heldout_{m}": v for m, v in scores[a].items()}
            runs[a] = C.log_arm(arms[a]["_cfg"], f"flow_gdpo_vs_sum/{a}", arms[a]["_history"], final, rows, text)
    for a in RL_ARMS:
        arms[a].pop("_history"), arms[a].pop("_cfg")
    results = {"claim": claim_of([] if args.sft_seed is None else ["--sft-seed"]), "steps": args.steps, "n_heldout_edits": len(heldout),
               "samples_per_edit": cfg.flow_eval.samples_per_prompt, "n_train_edits": len(train),
               "sft": {**scores["sft"], "seed": sft_seed, "train_seconds": round(sft_seconds, 1)}, "arms": arms, "between_rl_arms": between,
               "table": rows, "mlflow_runs": runs, "runtime_s": round(time.time() - t0, 1)}
    print(f"runtime {results['runtime_s']}s")
    C.write_json(args, results)


if __name__ == "__main__":
    import sys

    C.run_seeds(main, claim_of(sys.argv[1:]))
