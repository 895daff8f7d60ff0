"""Claims (issue 16): inference-time samplers on arithmetic with quality-tagged SFT data, at measured compute.

Per seed: an SFT model trained on `task.options.arithmetic.quality_tags` data (a share of solutions with a planted
error, a share of prompts tagged "expert, verified: " / "careless: "), then on the same held-out prompts every
sampler of rollout/samplers.py (greedy, temperature, beam, power, ppt, ttsd), each with its accuracy and forward
tokens per answer; how far each counterfactual context moves greedy accuracy; and an RL model (GRPO from the same
SFT checkpoint, `--steps` updates) decoded greedily.

  1. PPT beats single-chain power sampling at matched compute (power gets at least PPT's forward tokens).
  2. TTSD beats temperature sampling (one sample, and majority vote at TTSD's compute) and beam search.
  3. A PPT-sampled answer of the SFT model matches the RL model's greedy answer (power sampling's headline).

Each claim: per-seed paired differences, their mean and 95% t-interval, and a verdict (reproduced: the interval
is above 0; contradicted: below 0; inconclusive: it holds 0). One figure, accuracy against forward tokens per
answer for all samplers, is logged to MLflow and written to docs/samplers_accuracy_vs_compute.png.

    python experiments/samplers_compare.py --seeds 3 --steps 200 --json /tmp/samplers.json
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402
import torch  # noqa: E402

from posttrain.eval.harness import answer_metrics  # noqa: E402
from posttrain.rollout.beam import BeamOptions, TTSDOptions  # noqa: E402
from posttrain.rollout.power import PowerOptions, PPTOptions  # noqa: E402
from posttrain.rollout.samplers import SampleRequest, draw, with_context  # noqa: E402

FIGURE = C.REPO / "docs" / "samplers_accuracy_vs_compute.png"
TAGS = ["task.options.arithmetic.quality_tags=true"]


def summary(values: list[float]) -> dict:
    """Mean, 95% Student-t interval and the per-seed values (the claims harness's report, kept small here)."""
    from scipy import stats

    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return {"mean": mean, "lo": float("nan"), "hi": float("nan"), "values": values}
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = float(stats.t.ppf(0.975, n - 1)) * sd / math.sqrt(n)
    return {"mean": mean, "lo": mean - half, "hi": mean + half, "values": values}


def verdict(diffs: list[float]) -> dict:
    s = summary(diffs)
    word = "reproduced" if s["lo"] > 0 else "contradicted" if s["hi"] < 0 else "inconclusive"
    return {**s, "verdict": word}


def arms(args) -> list[tuple[str, str, object, int]]:
    """(arm, sampler, options, answers per prompt)."""
    power = lambda steps, full: PowerOptions(alpha=args.alpha, blocks=args.blocks, mcmc_steps=steps, full_tail=full)  # noqa: E731
    return [
        ("greedy", "greedy", None, 1),
        ("temperature", "temperature", None, args.k),
        ("beam", "beam", BeamOptions(width=args.width, length_penalty=1.0), 1),
        ("power", "power", power(args.mcmc, False), 1),
        ("ppt", "ppt", PPTOptions(alpha=args.alpha, replicas=args.replicas, blocks=args.blocks, mcmc_steps=args.mcmc, swap="deo",
                                  swap_every=1, full_tail=True), 1),
        ("ttsd", "ttsd", TTSDOptions(width=args.width, top_k=args.top_k, beta=args.beta, length_penalty=1.0,
                                     positive="expert, verified: ", negative="careless: "), 1),
        ("beam_wide", "beam", BeamOptions(width=3 * args.width, length_penalty=1.0), 1),  # TTSD's rows per step
    ]


def run_seed(args, seed: int) -> dict:
    args.seed = seed
    cfg = C.load_config(args, TAGS + [f"eval.n_prompts={args.prompts}", f"eval.batch_size={args.prompts}"])
    task, train, held, path, sft_eval = C.sft_start(cfg, seed)
    held = held[: args.prompts]
    model, tok = C.load_pretrained(path)
    model.eval()
    out: dict = {"seed": seed}
    for arm, name, options, n in arms(args):
        start = time.time()
        request = SampleRequest(cfg.eval.max_new_tokens, n, cfg.eval.temperature, (), args.chunk)
        sampled = draw(name, model, tok, held, request, options, torch.Generator().manual_seed(seed))
        m = answer_metrics("m", sampled, task, held)
        out[arm] = {"accuracy": m["m_accuracy"], "forward_tokens": m["m_forward_tokens_per_answer"], "seconds": time.time() - start,
                    **{k[2:]: v for k, v in m.items() if k.startswith(("m_majority", "m_pass"))}, **sampled.stats}
        print(f"seed {seed} {arm:12s} acc {m['m_accuracy']:.3f} fwd/answer {m['m_forward_tokens_per_answer']:.1f} "
              f"({time.time() - start:.0f}s) {sampled.stats}", flush=True)
    # single-chain power sampling with full scoring and at least PPT's forward tokens: more MH moves per block
    # until its compute reaches PPT's
    steps = args.mcmc * args.replicas
    for _ in range(8):
        options = PowerOptions(alpha=args.alpha, blocks=args.blocks, mcmc_steps=steps, full_tail=True)
        request = SampleRequest(cfg.eval.max_new_tokens, 1, cfg.eval.temperature, (), args.chunk)
        sampled = draw("power", model, tok, held, request, options, torch.Generator().manual_seed(seed))
        m = answer_metrics("m", sampled, task, held)
        if m["m_forward_tokens_per_answer"] >= out["ppt"]["forward_tokens"]:
            break
        steps = math.ceil(steps * 1.5)
    out["power_matched"] = {"accuracy": m["m_accuracy"], "forward_tokens": m["m_forward_tokens_per_answer"], "mcmc_steps": steps,
                            **sampled.stats}
    print(f"seed {seed} power_matched acc {m['m_accuracy']:.3f} fwd/answer {m['m_forward_tokens_per_answer']:.1f} mcmc {steps}", flush=True)
    # majority vote of temperature samples at TTSD's compute (the prompt's keys are shared by the votes)
    votes = 1
    while True:
        request = SampleRequest(cfg.eval.max_new_tokens, votes, cfg.eval.temperature, (), args.chunk)
        sampled = draw("temperature", model, tok, held, request, None, torch.Generator().manual_seed(seed + 100))
        per_prompt = sampled.total_forward_tokens / len(held)
        if per_prompt >= out["ttsd"]["forward_tokens"] or votes >= 256:
            break
        votes *= 2
    m = answer_metrics("m", sampled, task, held, votes=True)
    out["temperature_vote"] = {"accuracy": m[f"m_majority_at_{votes}"], "forward_tokens": per_prompt, "votes": votes}
    print(f"seed {seed} temperature_vote acc {out['temperature_vote']['accuracy']:.3f} fwd/prompt {per_prompt:.1f} votes {votes}", flush=True)
    # how far each context moves greedy accuracy
    for context, prefix in (("plain", ""), ("positive", "expert, verified: "), ("negative", "careless: ")):
        shown = [with_context(e, prefix) for e in held]
        sampled = draw("greedy", model, tok, shown, SampleRequest(cfg.eval.max_new_tokens, chunk=args.chunk))
        out[f"context_{context}"] = answer_metrics("m", sampled, task, held)["m_accuracy"]
    # the RL model from the same SFT checkpoint, decoded greedily
    if args.steps > 0:
        _, after, seconds = C.run_arm(cfg, cfg.rl, task, train, held, path, seed)
        out["rl_greedy"] = {"accuracy": after["greedy_accuracy"], "forward_tokens": after["greedy_forward_tokens_per_answer"],
                            "seconds": seconds}
        print(f"seed {seed} rl_greedy    acc {after['greedy_accuracy']:.3f} ({seconds:.0f}s)", flush=True)
    return out


def claims(per_seed: list[dict]) -> dict:
    acc = lambda arm: [s[arm]["accuracy"] for s in per_seed]  # noqa: E731
    diff = lambda a, b: [x - y for x, y in zip(acc(a), acc(b))]  # noqa: E731
    out = {
        "ppt_vs_power_matched (full scoring, power >= PPT's compute)": verdict(diff("ppt", "power_matched")),
        "ppt_vs_power (the paper's sampler)": verdict(diff("ppt", "power")),
        "ttsd_vs_temperature (one sample)": verdict(diff("ttsd", "temperature")),
        "ttsd_vs_temperature_vote (majority at TTSD's compute)": verdict(diff("ttsd", "temperature_vote")),
        "ttsd_vs_beam": verdict(diff("ttsd", "beam")),
        "ttsd_vs_beam_wide (3x width, TTSD's rows)": verdict(diff("ttsd", "beam_wide")),
        "context_positive_minus_plain (greedy)": verdict([s["context_positive"] - s["context_plain"] for s in per_seed]),
        "context_negative_minus_plain (greedy)": verdict([s["context_negative"] - s["context_plain"] for s in per_seed]),
    }
    if all("rl_greedy" in s for s in per_seed):
        out["ppt_sft_vs_rl_greedy"] = verdict(diff("ppt", "rl_greedy"))
        out["power_sft_vs_rl_greedy"] = verdict(diff("power", "rl_greedy"))
    return out


def figure(per_seed: list[dict], names: list[str]):
    """Left: accuracy (mean over seeds, each seed a faint dot) against forward tokens per answer. Right: accuracy
    minus greedy accuracy on the same seed, mean and 95% t-interval (what the seeds' spread in SFT quality hides)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), sharex=True)
    for i, arm in enumerate(n for n in names if all(n in s for s in per_seed)):
        color = f"C{i % 10}"
        acc = [s[arm]["accuracy"] for s in per_seed]
        tokens = summary([s[arm]["forward_tokens"] for s in per_seed])["mean"]
        left.scatter([tokens] * len(acc), acc, color=color, alpha=0.3, s=12)
        left.scatter([tokens], [sum(acc) / len(acc)], color=color, s=40, label=arm)
        gain = summary([a - s["greedy"]["accuracy"] for a, s in zip(acc, per_seed)])
        err = [[gain["mean"] - gain["lo"]], [gain["hi"] - gain["mean"]]] if len(per_seed) > 1 else None
        right.errorbar([tokens], [gain["mean"]], yerr=err, fmt="o", capsize=3, color=color)
    for ax in (left, right):
        ax.set_xscale("log")
        ax.set_xlabel("forward tokens per answer (prompt + generated, all contexts)")
    right.axhline(0.0, color="grey", lw=0.8)
    left.set_ylabel("held-out accuracy (dots: seeds)")
    right.set_ylabel("accuracy - greedy accuracy (same seed), 95% CI")
    left.legend(fontsize=7, loc="best")
    fig.suptitle(f"samplers on 2-digit addition, quality-tagged SFT, {len(per_seed)} seeds", fontsize=10)
    fig.tight_layout()
    return fig


NAMES = ["greedy", "temperature", "temperature_vote", "beam", "beam_wide", "power", "power_matched", "ppt", "ttsd", "rl_greedy"]


def replot(results_json: Path, figure_path: Path) -> None:
    """Redraw the figure of a finished run from its --json results."""
    figure(json.loads(results_json.read_text())["per_seed"], NAMES).savefig(figure_path, dpi=120)


def main() -> None:
    args = C.parse_args(__doc__, 200, [
        ("--prompts", int, 200, "held-out prompts per seed"), ("--alpha", float, 4.0, "power / top PPT power"),
        ("--blocks", int, 3, "blocks"), ("--mcmc", int, 2, "MH moves per block (power; per replica for PPT)"),
        ("--replicas", int, 4, "PPT replicas"), ("--width", int, 4, "beam / TTSD width"), ("--top-k", int, 8, "TTSD expansion"),
        ("--beta", float, 1.0, "TTSD beta"), ("--k", int, 8, "temperature samples per prompt"), ("--chunk", int, 50, "prompts per batch"),
        ("--figure", Path, FIGURE, "where the figure goes (docs/)"),
    ])
    seeds = list(range(args.seed, args.seed + args.seeds))  # the harness's --seed (first) and --seeds (how many)
    per_seed = [run_seed(args, s) for s in seeds]
    results = {"seeds": seeds, "per_seed": per_seed, "claims": claims(per_seed), "command": " ".join(sys.argv)}
    names = NAMES
    rows = []
    for arm in names:
        if all(arm in s for s in per_seed):
            a, f = summary([s[arm]["accuracy"] for s in per_seed]), summary([s[arm]["forward_tokens"] for s in per_seed])
            rows.append({"arm": arm, "accuracy": a["mean"], "lo": a["lo"], "hi": a["hi"], "forward_tokens": f["mean"],
                         "per_seed": " ".join(f"{v:.3f}" for v in a["values"])})
    text = C.print_table("accuracy and forward tokens per answer", rows)
    for claim, v in results["claims"].items():
        line = f"{claim}: {v['mean']:+.3f} [{v['lo']:+.3f}, {v['hi']:+.3f}] per seed {[round(x, 3) for x in v['values']]} -> {v['verdict']}"
        text += "\n" + line
        print(line, flush=True)
    fig = figure(per_seed, names)
    if not args.micro:
        fig.savefig(args.figure, dpi=120)
    if not args.no_mlflow:
        cfg = C.load_config(args, TAGS)
        with C.stage_run(cfg, "samplers_compare", launcher="experiments") as tracker:
            tracker.log_metrics({f"{r['arm']}_accuracy": r["accuracy"] for r in rows} | {f"{r['arm']}_forward_tokens": r["forward_tokens"] for r in rows})
            tracker.log_figure(fig, "accuracy_vs_forward_tokens.png")
            tracker.log_table(rows, "results_table.json")
            tracker.log_text(text, "results_table.txt")
    C.write_json(args, results)


if __name__ == "__main__":
    main()
