"""Claim (issue 39): TTSD's reward on a real checkpoint, SmolLM2-135M-Instruct. Test-time self-distillation scores an
answer y by the log-odds r(y) = log p(y|x,c+) - log p(y|x,c-) under two fixed contexts, c+ priming an exemplary,
verified solution and c- a careless one (specs §6), and decodes towards the Gibbs target p(y|x) exp(r(y)/beta) / Z.
TTSD works only if r ranks right answers above wrong ones; this measures that directly, on N temperature samples per
problem, as best-of-N picks over the same samples (every pick sees the same N answers):

    temperature   the first sample (one answer at T, no pick)
    log_odds      the sample with the highest r(y)
    tilted        the sample with the highest log p(y|x) + r(y)/beta: the Gibbs target's score, the sequence-level
                  quantity TTSD's beam search approximates token by token
    likelihood    the highest mean per-token log p(y|x) (the checkpoint at T 1 as its own reward model)
    vote          the most common parsed answer (self-consistency)
    oracle        pass@N, the verifier's pick: the ceiling of any pick

and the AUC of r over a problem's (right, wrong) sample pairs, pooled over problems (0.5: r cannot tell them apart;
ties count a half), with r's mean on right and on wrong samples.

Why this experiment: experiments/smollm2_samplers.py runs the TTSD sampler itself, but its premise (greedy accuracy
under c+ above that under c-) failed on every seed: with the contexts written before the problem, both drive greedy
accuracy to 0. This script also measures greedy accuracy under both contexts in three framings (before the problem,
after it, at the end of the system prompt) and with a second, shorter pair of contexts (`PAIRS`), so the note can say
whether any framing moves the checkpoint. The claim's picks score the contexts in smollm2_samplers' framing (before
the problem: the TTSD sampler's).

No training: the imported checkpoint (experiments/smollm2_rl.py's import, problems and eval settings: 48 new tokens,
the example's system prompt, the chat template); a seed is smollm2_samplers' slice of the held-out problems (seed s:
problems s*P .. (s+1)*P-1 of a fixed permutation) and the sampling generator; the samples at T 0.7, as there.

Premise (experiments/_premises.py): room to pick, pass@N minus the one-sample accuracy >= 0.1 (a pick cannot beat one
sample when the N answers are all right or all wrong).

Measured (experiments/claims.py's flags, 6 seeds): 399-478 s a seed on one thread, the box shared with one other job.

    .venv/bin/python experiments/smollm2_ttsd_reward.py [--prompts 30] [--n 8] [--beta 1.0] [--threads N] [--work DIR] [--seeds 3] [--json FILE]
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402
import smollm2_rl as base  # noqa: E402
import smollm2_samplers as samplers  # noqa: E402

from posttrain.rollout.samplers import with_context  # noqa: E402

# (c+, c-) pairs: the spec's templates as smollm2_samplers writes them, and a shorter pair that names the arithmetic
PAIRS = {"spec": tuple(c.strip() for c in samplers.CONTEXTS),
         "short": ("Double-check every calculation.", "Make one calculation mistake on purpose.")}
FRAMINGS = {"before": "before the problem", "after": "after the problem", "system": "at the end of the system prompt"}
PICKS = ("temperature", "log_odds", "tilted", "likelihood", "vote", "oracle")


def framed(example, context: str, where: str):
    """`example` with `context` written before its problem, after it, or at the end of its system prompt."""
    if where == "before":  # as the TTSD sampler writes its contexts (rollout/samplers.py)
        return with_context(example, f"{context}\n\n")
    if where == "after":
        return replace(example, prompt=f"{example.prompt}\n\n{context}")
    return replace(example, system=f"{example.system} {context}" if example.system else context)


def scored(model, tok, examples: list, samples, chunk: int):
    """[rows] the sum and the mean of each sample's token log-probs under `examples` (one per row) as its prompts."""
    import torch

    from posttrain.models.chat import encode_prompts
    from posttrain.models.logprobs import completion_logprobs

    sums, means = [], []
    with torch.no_grad():
        for start in range(0, len(examples), chunk):
            stop = min(start + chunk, len(examples))
            ids, mask = encode_prompts(tok, examples[start:stop], samples.completion_ids.device)
            logp, _ = completion_logprobs(model, ids, mask, samples.completion_ids[start:stop], samples.attention[start:stop])
            keep = samples.completion_mask[start:stop].float()
            sums.append((logp * keep).sum(-1))
            means.append(sums[-1] / keep.sum(-1).clamp(min=1.0))
    return torch.cat(sums), torch.cat(means)


def picks(task, held: list, texts: list[str], finished: list[bool], n: int, r, base_sum, base_mean, beta: float) -> dict:
    """Each pick's accuracy over the problems (`r`, `base_sum`, `base_mean`: one score per sample, prompt-major), and
    r's AUC over each problem's (right, wrong) pairs, pooled, with r's means on right and on wrong samples."""
    import torch

    from posttrain.eval.best_of_n import auc, oracle_pick, vote_pick

    r, base_mean = torch.as_tensor(r, dtype=torch.float64), torch.as_tensor(base_mean, dtype=torch.float64)
    tilted = torch.as_tensor(base_sum, dtype=torch.float64) + r / beta
    correctness = [float(task.correctness_reward(texts[i], finished[i], held[i // n])) for i in range(len(texts))]
    solved = {name: 0.0 for name in PICKS}
    above = pairs = 0.0
    for p in range(len(held)):
        rows = slice(p * n, (p + 1) * n)
        correct, parsed = correctness[rows], [task.parse(t) for t in texts[rows]]
        chosen = {"temperature": 0, "log_odds": int(r[rows].argmax()), "tilted": int(tilted[rows].argmax()),
                  "likelihood": int(base_mean[rows].argmax()), "vote": vote_pick(parsed, correct, base_mean[rows]),
                  "oracle": oracle_pick(parsed, correct, base_mean[rows])}
        for name, j in chosen.items():
            solved[name] += correct[j]
        k = sum(c >= 1.0 for c in correct) * sum(c < 1.0 for c in correct)
        if k:  # this problem's (right, wrong) pairs
            above, pairs = above + auc(r[rows], torch.tensor(correct)) * k, pairs + k
    out = {name: {"accuracy": solved[name] / len(held)} for name in PICKS}
    mean = lambda xs: float(xs.mean()) if len(xs) else float("nan")  # noqa: E731
    right = torch.tensor(correctness) >= 1.0
    out["log_odds"].update(auc=above / pairs if pairs else float("nan"), pairs=pairs, r_mean_right=mean(r[right]),
                           r_mean_wrong=mean(r[~right]), right_samples=int(right.sum()), wrong_samples=int((~right).sum()))
    return out


def main() -> None:
    args = C.parse_args(__doc__.split("\n")[0], 1, [  # (--steps: unused, no training)
        ("--prompts", int, 30, "held-out problems per seed (smollm2_samplers' slices)"), ("--n", int, 8, "samples per problem"),
        ("--beta", float, 1.0, "the Gibbs target's beta (tilted pick)"), ("--temperature", float, 0.7, "the samples' temperature"),
        ("--chunk", int, 16, "rows per scoring forward"), ("--threads", int, 2, "torch threads"),
        ("--work", Path, base.REPO / "outputs" / "claims" / "smollm2_objectives", "the import and problems (shared with smollm2_objectives)"),
    ], params=base.PARAMS)
    import torch

    from posttrain.eval.harness import answer_metrics
    from posttrain.rollout.samplers import SampleRequest, draw

    cfg, model, tok, task, held = samplers.imported(args)
    start = time.time()
    request = SampleRequest(cfg.eval.max_new_tokens, args.n, args.temperature, tuple(cfg.eval.stop), args.prompts)
    sampled = draw("temperature", model, tok, held, request, None, torch.Generator().manual_seed(args.seed))
    rows = [e for e in held for _ in range(args.n)]  # prompt-major, as the sampler's rows
    texts, finished = sampled.texts, sampled.samples.finished.tolist()
    base_sum, base_mean = scored(model, tok, rows, sampled.samples, args.chunk)
    c_pos, c_neg = PAIRS["spec"]
    pos, _ = scored(model, tok, [framed(e, c_pos, "before") for e in rows], sampled.samples, args.chunk)
    neg, _ = scored(model, tok, [framed(e, c_neg, "before") for e in rows], sampled.samples, args.chunk)
    arms = picks(task, held, texts, finished, args.n, (pos - neg).tolist(), base_sum.tolist(), base_mean.tolist(), args.beta)
    generated = float(sampled.samples.completion_mask.sum()) / len(rows)
    for arm in arms.values():
        arm["generated_tokens"] = generated
    print(f"seed {args.seed}: " + ", ".join(f"{k} {v['accuracy']:.3f}" for k, v in arms.items())
          + f"; r AUC {arms['log_odds']['auc']:.3f} over {arms['log_odds']['pairs']:.0f} pairs ({time.time() - start:.0f}s)", flush=True)
    # greedy accuracy under each context, framing and pair: do the contexts move the checkpoint at all?
    greedy = replace(request, n=1)
    contexts = {"plain": answer_metrics("m", draw("greedy", model, tok, held, greedy), task, held)["m_accuracy"]}
    for pair, (c_pos, c_neg) in PAIRS.items():
        for where in FRAMINGS:
            for side, context in (("positive", c_pos), ("negative", c_neg)):
                shown = [framed(e, context, where) for e in held]
                contexts[f"{pair}_{where}_{side}"] = answer_metrics("m", draw("greedy", model, tok, shown, greedy), task, held)["m_accuracy"]
            print(f"seed {args.seed} greedy under the {pair} contexts {FRAMINGS[where]}: c+ {contexts[f'{pair}_{where}_positive']:.3f} "
                  f"c- {contexts[f'{pair}_{where}_negative']:.3f} (plain {contexts['plain']:.3f})", flush=True)
    table = [{"arm": arm, "accuracy": v["accuracy"]} for arm, v in arms.items()]
    text = C.print_table(f"SmolLM2-135M-Instruct, seed {args.seed}: best-of-{args.n} picks over the same samples", table)
    results = {"seed": args.seed, "dataset": "word_problems", "checkpoint": base.CHECKPOINT, "prompts": len(held), "n": args.n,
               "beta": args.beta, "temperature": args.temperature, "problems": [e.prompt for e in held],
               "pairs": {k: list(v) for k, v in PAIRS.items()}, "greedy_under_contexts": contexts, "threads": args.threads,
               "seconds": time.time() - start, "table": table, "arms": arms}
    if not args.no_mlflow:
        C.log_arm(cfg, "smollm2_ttsd_reward", [], {f"{r['arm']}_accuracy": r["accuracy"] for r in table}, table, text)
    C.write_json(args, results)


if __name__ == "__main__":
    C.run_seeds(main, "smollm2_ttsd_reward")
