"""Claim (RareDx-KGPO): the knowledge-graph graded reward (`kgpo`) teaches ranked differential diagnosis better than
the plain Hit@1 reward it refines, at the same RL budget.

Task: ranked differential diagnosis over the synthetic phenotype-disease graph (tasks/diagnosis.py). Arms from the
same SFT start and seed, both GRPO with the same steps, prompts and group size: `hit1` (the task's correctness
reward: the gold disease ranked first) and `kgpo` (the graded list reward, saturating aggregation; the Hit@1
column rides along at weight 0). The graded reward's argument is the signal it gives where Hit@1 gives none: a
group whose samples all miss the gold at rank 1 has zero Hit@1 advantage, yet its lists differ in how close they
come. The start is measured for exactly that: `--samples` samples of each of `--probe` random training prompts at
temperature 1, the share of samples whose graded reward differs from their Hit@1, and the share of groups where
Hit@1 is constant (no GRPO signal) while the graded reward is not.
Reported on the held-out prompts after RL (greedy): Hit@1, Hit@3 and the mean graded reward of the greedy list.

    .venv/bin/python experiments/kgpo_vs_hit1.py [--steps N] [--samples M] [--probe P] [--json FILE] [--micro]
"""

from __future__ import annotations

import random
import time

import torch

import _common as C
from posttrain import resolve
from posttrain.config import RewardSpec
from posttrain.models import load_pretrained
from posttrain.rewards.kgpo import kgpo
from posttrain.rollout.sampling import generate

TASK = ["task.name=diagnosis", "task.n_train=1200", "task.n_heldout=300", "rl.max_new_tokens=12", "eval.max_new_tokens=12",
        "eval.n_prompts=300", "eval.batch_size=300"]
MICRO_TASK = ["task.n_train=100", "task.n_heldout=20", "eval.n_prompts=20", "eval.batch_size=20"]
ARMS = {"hit1": (RewardSpec(name="correctness", weight=1.0),),
        "kgpo": (RewardSpec(name="kgpo", weight=1.0), RewardSpec(name="correctness", weight=0.0))}


def scored(model, tok, task, rl_cfg, examples, samples: int, seed: int, greedy: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(graded reward, Hit@1) of `samples` completions per example (rows example-major), greedy or at temperature 1."""
    model.eval()
    with torch.no_grad():
        out, texts = generate(model, tok, [e.prompt for e in examples], rl_cfg.max_new_tokens, group_size=samples, greedy=greedy,
                              generator=torch.Generator().manual_seed(seed))
    finished = out.finished.tolist()
    rows = [e for e in examples for _ in range(samples)]
    graded = kgpo(task, rows, texts, finished, rl=rl_cfg)
    hit1 = torch.tensor([task.correctness_reward(t, f, e) for t, f, e in zip(texts, finished, rows)])
    return graded, hit1


def start_signal(model, tok, task, rl_cfg, train, samples: int, probe: int, seed: int) -> dict[str, float]:
    """What the graded reward adds over Hit@1 at the start, on sampled groups of training prompts."""
    probed = random.Random(seed).sample(train, min(probe, len(train)))  # not train[:P]: the SFT examples come first
    graded, hit1 = scored(model, tok, task, rl_cfg, probed, samples, seed, greedy=False)
    g, h = graded.view(-1, samples), hit1.view(-1, samples)
    graded_varies, hit1_varies = g.std(dim=1) > 1e-6, h.std(dim=1) > 1e-6
    return {"share_graded_differs": float(((graded - hit1).abs() > 1e-6).float().mean()),
            "share_groups_signal_graded_only": float((graded_varies & ~hit1_varies).float().mean()),
            "share_groups_signal_hit1": float(hit1_varies.float().mean()),
            "sampled_hit1": float(hit1.mean()), "sampled_graded": float(graded.mean())}


def main() -> None:
    args = C.parse_args(__doc__.split("\n")[0], 60, [("--samples", int, 8, "samples per probed training prompt (the start's signal)"),
                                                     ("--probe", int, 128, "training prompts probed at the start")])
    t0 = time.time()
    cfg = C.load_config(args, TASK + (MICRO_TASK if args.micro else []))
    task, train, held, path, sft = C.sft_start(cfg, args.seed)
    kgpo_cfg = resolve.updated(cfg.rl, "rl", rewards=ARMS["kgpo"])  # the graded reward's settings, for scoring any arm
    model, tok = load_pretrained(path)
    start = start_signal(model, tok, task, kgpo_cfg, train, args.samples, args.probe, args.seed)
    graded_before, _ = scored(model, tok, task, kgpo_cfg, held, 1, args.seed, greedy=True)
    print(f"SFT start: held-out Hit@1 {sft['greedy_accuracy']:.4f}, {start}", flush=True)

    def measured(m, t):
        metrics = C.evaluate(m, t, task, held, cfg.eval, args.seed)[0]
        return {**metrics, "graded": float(scored(m, t, task, kgpo_cfg, held, 1, args.seed, greedy=True)[0].mean())}

    k = max(1, args.steps // 5)
    arms = {}
    for arm, specs in ARMS.items():
        rl_cfg = resolve.updated(cfg.rl, "rl", rewards=specs)
        history, after, seconds = C.run_arm(cfg, rl_cfg, task, train, held, path, args.seed, evaluate_fn=measured)
        arms[arm] = {"heldout_after": after, "rl_seconds": round(seconds, 1),
                     "train_hit1_first": C.window_mean(history, "accuracy", True, k), "train_hit1_last": C.window_mean(history, "accuracy", False, k),
                     "train_hit1_curve": C.curve(history, "accuracy"),
                     "_history": history, "_cfg": cfg.model_copy(update={"rl": rl_cfg})}
        print(f"{arm}: {seconds:.0f}s, Hit@1 {after['greedy_accuracy']:.4f}, Hit@3 {after['greedy_hit_at_3']:.4f}, graded {after['graded']:.4f}", flush=True)
    rows = [{"arm": a, "hit1_before": sft["greedy_accuracy"], "hit1_after": arms[a]["heldout_after"]["greedy_accuracy"],
             "hit3_before": sft["greedy_hit_at_3"], "hit3_after": arms[a]["heldout_after"]["greedy_hit_at_3"],
             "graded_before": float(graded_before.mean()), "graded_after": arms[a]["heldout_after"]["graded"],
             "sampled_hit1_after": arms[a]["heldout_after"]["sampled_accuracy"],
             "train_hit1_last": arms[a]["train_hit1_last"], "rl_seconds": arms[a]["rl_seconds"]} for a in ARMS]
    text = C.print_table(f"\nkgpo vs hit@1 reward, {args.steps} steps, {len(held)} held-out prompts (greedy)", rows)
    runs = {}
    if cfg.tracking.enabled:
        for a in ARMS:
            final = {f"heldout_{m}": v for m, v in arms[a]["heldout_after"].items()}
            runs[a] = C.log_arm(arms[a]["_cfg"], f"kgpo_vs_hit1/{a}", arms[a]["_history"], final, rows, text)
    for a in ARMS:
        arms[a].pop("_history"), arms[a].pop("_cfg")
    results = {"claim": "kgpo_vs_hit1", "steps": args.steps, "sft_heldout": sft, "start_signal": start, "arms": arms, "table": rows,
               "mlflow_runs": runs, "runtime_s": round(time.time() - t0, 1)}
    print(f"runtime {results['runtime_s']}s")
    C.write_json(args, results)


if __name__ == "__main__":
    C.run_seeds(main, "kgpo_vs_hit1")
