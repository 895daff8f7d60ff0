"""Claims (issue 16): inference-time samplers after quality-tagged SFT, at measured compute, on arithmetic
(`--dataset arithmetic`, claim `samplers_arithmetic`) or the example word problems (`--dataset word_problems`,
claim `samplers_word_problems`: examples/word_problems/, its params.yaml, generator and checkpoint maker).

One seed (`--seed`; the claims harness runs 3): an SFT model trained on quality-tagged data (a share of solutions
with a planted error, a share of prompts tagged "expert, verified: " / "careless: "; arithmetic:
`task.options.arithmetic.quality_tags`, word problems: the same fractions applied to the example's training rows,
the final answer changed), then on the same held-out prompts every sampler of rollout/samplers.py (greedy,
temperature, beam, power, ppt, ttsd) with its accuracy and forward tokens per answer; best-of-N over the
temperature samples drawn for the majority vote (eval/best_of_n.py: the verifier's pick = pass@N, the vote, the
likelihood pick); how far each counterfactual context moves greedy accuracy; and an RL model (GRPO from the same
SFT checkpoint, `--steps` updates) decoded greedily.

  1. PPT beats single-chain power sampling at matched compute (power gets at least PPT's forward tokens).
  2. TTSD beats temperature sampling (one sample, and majority vote at TTSD's compute) and beam search.
  3. A PPT- or power-sampled answer of the SFT model matches the RL model's greedy answer (power sampling's headline).

The harness (experiments/_claims.py) pairs the arms by seed: mean difference, 95% t-interval, verdict. The figure,
accuracy against forward tokens per answer over the seeds, goes to the claim's MLflow parent run and, run as a
script, to `--figure` (docs/).

    .venv/bin/python experiments/claims.py --claim samplers_arithmetic          # or samplers_word_problems
    .venv/bin/python experiments/samplers_compare.py --dataset word_problems --steps 60 --prompts 100 --seeds 3 --json /tmp/wp.json
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402
from _claims import t_interval  # noqa: E402
import torch  # noqa: E402

from posttrain.eval.best_of_n import PICKS, best_of_n_metrics  # noqa: E402
from posttrain.eval.harness import answer_metrics  # noqa: E402
from posttrain.rollout.beam import BeamOptions, TTSDOptions  # noqa: E402
from posttrain.rollout.power import PowerOptions, PPTOptions  # noqa: E402
from posttrain.rollout.samplers import SampleRequest, draw, with_context  # noqa: E402

FIGURES = {"arithmetic": C.REPO / "docs" / "samplers_accuracy_vs_compute.png",
           "word_problems": C.REPO / "docs" / "samplers_accuracy_vs_compute_word_problems.png"}
TAGS = ["task.options.arithmetic.quality_tags=true"]
WORD_PROBLEMS = C.REPO / "examples" / "word_problems"
CLAIM = {"arithmetic": "samplers_arithmetic", "word_problems": "samplers_word_problems"}


def claim_of(argv: list[str]) -> str:
    """The claim a command line runs (its --dataset)."""
    dataset = argv[argv.index("--dataset") + 1] if "--dataset" in argv else "arithmetic"
    return CLAIM.get(dataset, CLAIM["arithmetic"])


def _example_module(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"word_problems_{name}", WORD_PROBLEMS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def word_problem_files() -> list[str]:
    """The example's problems and fresh checkpoint (its generate.py and make_model.py, the sizes its dvc.yaml uses),
    made once under the experiments cache; the overrides that point the example's params.yaml at them."""
    root = C.CACHE / "word_problems"
    if not (root / "done").exists():
        gen = _example_module("generate")
        train, heldout = gen.generate(3000, 300, seed=0)
        gen.write(root / "problems" / "train.jsonl", train)
        gen.write(root / "problems" / "heldout.jsonl", heldout)
        _example_module("make_model").make_model(root / "problems", root / "checkpoint")
        (root / "done").write_text("ok")
    return [f"task.options.dataset.path={root / 'problems' / 'train.jsonl'}",
            f"task.options.dataset.heldout_path={root / 'problems' / 'heldout.jsonl'}", f"model.path={root / 'checkpoint'}"]


def tagged_word_problems(cfg):
    """SFT rows with quality tags, as task.options.arithmetic.quality_tags makes them (its fractions and tags): a
    `careless_fraction` of solutions with the final answer changed, a `tagged_fraction` of prompts prefixed with
    their quality. The verifier's answer is untouched; held-out problems stay untagged."""
    from posttrain.tasks.arithmetic import planted_error

    opts = cfg.task.options_for("arithmetic")

    def tag(train, seed: int):
        import random

        rng, out = random.Random(seed), []
        for e in train:
            careless, tagged = rng.random() < opts.careless_fraction, rng.random() < opts.tagged_fraction
            completion = e.completion
            if careless:
                head, _, tail = completion.rpartition(e.answer)
                completion = head + planted_error(e.answer, rng) + tail
            prefix = (opts.careless_tag if careless else opts.expert_tag) if tagged else ""
            out.append(replace(e, prompt=prefix + e.prompt, completion=completion))
        return out

    return tag


def summary(values: list[float]) -> dict:
    """Mean and 95% Student-t interval (the claims harness's) with the per-seed values."""
    mean, lo, hi = t_interval(values)
    return {"mean": mean, "lo": lo, "hi": hi, "values": values}


TAGGED = ("expert, verified: ", "careless: ")  # the quality tags the SFT data carries: TTSD's c+ and c-


def arms(args, contexts: tuple[str, str] = TAGGED) -> list[tuple[str, str, object, int]]:
    """(arm, sampler, options, answers per prompt); `contexts`: TTSD's (c+, c-), written before the prompt's text."""
    power = lambda steps, full: PowerOptions(alpha=args.alpha, blocks=args.blocks, mcmc_steps=steps, full_tail=full)  # noqa: E731
    return [
        ("greedy", "greedy", None, 1),
        ("temperature", "temperature", None, args.k),
        ("beam", "beam", BeamOptions(width=args.width, length_penalty=1.0), 1),
        ("power", "power", power(args.mcmc, False), 1),
        ("ppt", "ppt", PPTOptions(alpha=args.alpha, replicas=args.replicas, blocks=args.blocks, mcmc_steps=args.mcmc, swap="deo",
                                  swap_every=1, full_tail=True), 1),
        ("ttsd", "ttsd", TTSDOptions(width=args.width, top_k=args.top_k, beta=args.beta, length_penalty=1.0,
                                     positive=contexts[0], negative=contexts[1]), 1),
        ("beam_wide", "beam", BeamOptions(width=3 * args.width, length_penalty=1.0), 1),  # TTSD's rows per step
    ]


def sampler_flags(k: int, chunk: int, max_votes: int) -> list[tuple]:
    """The samplers' settings as `C.parse_args` extra flags (every script measuring with `measure` takes them)."""
    return [
        ("--alpha", float, 4.0, "power / top PPT power"), ("--blocks", int, 3, "blocks"),
        ("--mcmc", int, 2, "MH moves per block (power; per replica for PPT)"), ("--replicas", int, 4, "PPT replicas"),
        ("--width", int, 4, "beam / TTSD width"), ("--top-k", int, 8, "TTSD expansion"), ("--beta", float, 1.0, "TTSD beta"),
        ("--k", int, k, "temperature samples per prompt"), ("--chunk", int, chunk, "prompts per batch"),
        ("--max-votes", int, max_votes, "most temperature samples per prompt for the vote at TTSD's compute"),
    ]


def measure(model, tok, task, held: list, args, seed: int, request: SampleRequest, contexts: tuple[str, str] = TAGGED) -> dict:
    """Every sampler arm on `held` (`request`: the new tokens, the temperature of the `temperature` sampler and the
    vote, stop strings, chunk; `contexts`: TTSD's c+ and c-), power at PPT's compute, the temperature vote and
    best-of-N at TTSD's compute, and the greedy accuracy under no context, c+ and c-.
    {arm: {accuracy, forward_tokens, seconds, ...sampler stats}}."""
    out: dict = {}
    for arm, name, options, n in arms(args, contexts):
        start = time.time()
        sampled = draw(name, model, tok, held, replace(request, n=n), options, torch.Generator().manual_seed(seed))
        m = answer_metrics("m", sampled, task, held)
        out[arm] = {"accuracy": m["m_accuracy"], "forward_tokens": m["m_forward_tokens_per_answer"], "seconds": time.time() - start,
                    "generated_tokens": m["m_tokens_per_answer"],
                    **{k[2:]: v for k, v in m.items() if k.startswith(("m_majority", "m_pass"))}, **sampled.stats}
        print(f"seed {seed} {arm:12s} acc {m['m_accuracy']:.3f} fwd/answer {m['m_forward_tokens_per_answer']:.1f} "
              f"({time.time() - start:.0f}s) {sampled.stats}", flush=True)
    # single-chain power sampling with full scoring and at least PPT's forward tokens: more MH moves per block
    # until its compute reaches PPT's
    steps, start = args.mcmc * args.replicas, time.time()
    for _ in range(8):
        options = PowerOptions(alpha=args.alpha, blocks=args.blocks, mcmc_steps=steps, full_tail=True)
        sampled = draw("power", model, tok, held, replace(request, n=1), options, torch.Generator().manual_seed(seed))
        m = answer_metrics("m", sampled, task, held)
        if m["m_forward_tokens_per_answer"] >= out["ppt"]["forward_tokens"]:
            break
        steps = math.ceil(steps * 1.5)
    out["power_matched"] = {"accuracy": m["m_accuracy"], "forward_tokens": m["m_forward_tokens_per_answer"], "mcmc_steps": steps,
                            "seconds": time.time() - start, **sampled.stats}
    print(f"seed {seed} power_matched acc {m['m_accuracy']:.3f} fwd/answer {m['m_forward_tokens_per_answer']:.1f} mcmc {steps}", flush=True)
    # majority vote of temperature samples at TTSD's compute (the prompt's keys are shared by the votes), and
    # best-of-N over the same samples: the verifier's pick (pass@N), the vote, the likelihood pick
    votes, start = 1, time.time()
    while True:
        sampled = draw("temperature", model, tok, held, replace(request, n=votes), None, torch.Generator().manual_seed(seed + 100))
        per_prompt = sampled.total_forward_tokens / len(held)
        if per_prompt >= out["ttsd"]["forward_tokens"] or votes >= args.max_votes:
            break
        votes *= 2
    bon = best_of_n_metrics("bon", sampled, task, held, PICKS)
    out["temperature_vote"] = {"accuracy": bon["bon_vote_accuracy"], "forward_tokens": per_prompt, "votes": votes,
                               "seconds": time.time() - start}
    out["bon_likelihood"] = {"accuracy": bon["bon_likelihood_accuracy"], "forward_tokens": per_prompt, "n": votes}
    out["bon_oracle"] = {"accuracy": bon["bon_oracle_accuracy"], "forward_tokens": per_prompt, "n": votes}
    print(f"seed {seed} temperature_vote acc {out['temperature_vote']['accuracy']:.3f} likelihood pick {bon['bon_likelihood_accuracy']:.3f} "
          f"oracle (pass@{votes}) {bon['bon_oracle_accuracy']:.3f} fwd/prompt {per_prompt:.1f} votes {votes}", flush=True)
    # how far each context moves greedy accuracy
    for context, prefix in (("plain", ""), ("positive", contexts[0]), ("negative", contexts[1])):
        shown = [with_context(e, prefix) for e in held]
        sampled = draw("greedy", model, tok, shown, replace(request, n=1))
        out[f"context_{context}"] = {"accuracy": answer_metrics("m", sampled, task, held)["m_accuracy"],
                                     "forward_tokens": sampled.total_forward_tokens / len(held)}
    return out


def main() -> None:
    """One seed (`--seed`): every arm's accuracy and forward tokens per answer, as the results table."""
    args = C.parse_args(__doc__, 200, [
        ("--dataset", str, "arithmetic", "arithmetic | word_problems"), ("--prompts", int, 200, "held-out prompts per seed"),
        *sampler_flags(k=8, chunk=50, max_votes=256),
        ("--figure", Path, None, "run as a script: where the figure over the seeds goes (default docs/samplers_accuracy_vs_compute*.png)"),
    ])
    if args.dataset not in CLAIM:
        raise SystemExit(f"--dataset: {args.dataset!r} is not one of {', '.join(CLAIM)}")
    seed = args.seed
    sft_data, variant = None, ""
    if args.dataset == "word_problems":
        args.params = WORD_PROBLEMS / "params.yaml"
        overrides = word_problem_files()
    else:
        overrides = TAGS
    cfg = C.load_config(args, overrides + [f"eval.n_prompts={args.prompts}", f"eval.batch_size={args.prompts}"])
    if args.dataset == "word_problems":
        sft_data, variant = tagged_word_problems(cfg), "_tagged"
    task, train, held, path, sft_eval = C.sft_start(cfg, seed, sft_data, variant)
    held = held[: args.prompts]
    model, tok = C.load_pretrained(path)
    model = C.prepare_model(model, tok, cfg.model, torch.device("cpu"), train=False)
    out = {"seed": seed, **measure(model, tok, task, held, args, seed, SampleRequest(cfg.eval.max_new_tokens, 1, cfg.eval.temperature, (), args.chunk))}
    # the RL model from the same SFT checkpoint, decoded greedily
    if args.steps > 0:
        _, after, seconds = C.run_arm(cfg, cfg.rl, task, train, held, path, seed)
        out["rl_greedy"] = {"accuracy": after["greedy_accuracy"], "forward_tokens": after["greedy_forward_tokens_per_answer"],
                            "seconds": seconds}
        print(f"seed {seed} rl_greedy    acc {after['greedy_accuracy']:.3f} ({seconds:.0f}s)", flush=True)
    table = [{"arm": arm, "accuracy": v["accuracy"], "forward_tokens": v["forward_tokens"]} for arm, v in out.items() if isinstance(v, dict)]
    text = C.print_table(f"{args.dataset}, seed {seed}: accuracy and forward tokens per answer", table)
    results = {"seed": seed, "dataset": args.dataset, "table": table, "arms": out, "sft_eval": sft_eval}
    if not args.no_mlflow:
        C.log_arm(cfg, f"samplers_{args.dataset}", [], {f"{r['arm']}_{k}": r[k] for r in table for k in ("accuracy", "forward_tokens")},
                  table, text)
    C.write_json(args, results)


def figure(per_seed: list[dict], names: list[str] | None = None):
    """Left: accuracy (mean over seeds, each seed a faint dot) against forward tokens per answer. Right: accuracy
    minus greedy accuracy on the same seed, mean and 95% t-interval (what the seeds' spread in SFT quality hides).
    `per_seed`: one-seed results (their `arms`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    arms = [r["arms"] for r in per_seed]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), sharex=True)
    for i, arm in enumerate(n for n in names or NAMES if all(n in s for s in arms)):
        color = plt.cm.tab20(i % 20)
        acc = [s[arm]["accuracy"] for s in arms]
        tokens = summary([s[arm]["forward_tokens"] for s in arms])["mean"]
        left.scatter([tokens] * len(acc), acc, color=color, alpha=0.3, s=12)
        left.scatter([tokens], [sum(acc) / len(acc)], color=color, s=40, label=arm)
        gain = summary([a - s["greedy"]["accuracy"] for a, s in zip(acc, arms)])
        err = [[gain["mean"] - gain["lo"]], [gain["hi"] - gain["mean"]]] if len(arms) > 1 else None
        right.errorbar([tokens], [gain["mean"]], yerr=err, fmt="o", capsize=3, color=color)
    for ax in (left, right):
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # the minor labels overlap on a short range
        ax.set_xlabel("forward tokens per answer (prompt + generated, all contexts)")
    right.axhline(0.0, color="grey", lw=0.8)
    left.set_ylabel("held-out accuracy (dots: seeds)")
    right.set_ylabel("accuracy - greedy accuracy (same seed), 95% CI")
    left.legend(fontsize=7, loc="best")
    title = {"arithmetic": "2-digit addition", "word_problems": "the example word problems"}.get(per_seed[0].get("dataset"), "")
    start = "SmolLM2-135M-Instruct, no training" if per_seed[0].get("checkpoint") else "quality-tagged SFT"
    fig.suptitle(f"samplers on {title}, {start}, {len(per_seed)} seeds", fontsize=10)
    fig.tight_layout()
    return fig


NAMES = ["greedy", "temperature", "temperature_vote", "bon_likelihood", "bon_oracle", "beam", "beam_wide", "power", "power_matched", "ppt",
         "ttsd", "rl_greedy"]


def claim_figure(per_seed: list[dict]):
    """The claims harness's figure of the claim (logged to its MLflow parent run)."""
    return figure(per_seed), "accuracy_vs_forward_tokens.png"


def replot(results_json: Path, figure_path: Path) -> None:
    """Redraw the figure of a finished run from the harness's --json results."""
    figure(json.loads(results_json.read_text())["per_seed"]).savefig(figure_path, dpi=120)


if __name__ == "__main__":
    argv = sys.argv[1:]
    results = C.run_seeds(main, claim_of(argv), figure=claim_figure)
    if results and "--micro" not in argv:
        dataset = argv[argv.index("--dataset") + 1] if "--dataset" in argv else "arithmetic"
        replot_to = Path(argv[argv.index("--figure") + 1]) if "--figure" in argv else FIGURES.get(dataset, FIGURES["arithmetic"])
        figure(results["per_seed"]).savefig(replot_to, dpi=120)
        print(f"wrote {replot_to}")
