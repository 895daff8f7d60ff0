"""Best-of-N: N answers per prompt from any stochastic sampler of rollout/samplers.py, one kept per prompt by a
scorer, and the accuracy of the kept answers at the forward tokens the N draws cost.

oracle      the task's verifier picks: the prompt is solved when any of its N answers is correct. This is pass@N
            (Chen et al. 2021, arXiv 2107.03374, section 2.1, with k = n), an upper bound no deployed system has.
vote        the most common parsed answer (self-consistency, Wang et al. 2022, arXiv 2203.11171, eq. 1 with the
            unweighted vote; a tie goes to the answer drawn first); answers the task cannot parse do not vote.
likelihood  the answer with the highest mean per-token log-prob recorded by the sampler (the base model's for
            power, ppt, beam and ttsd; the sampling distribution's for temperature): the model as its own
            reward model, deployable without a verifier (Best-of-N by confidence; length-normalised so that a
            short answer does not win by having fewer tokens to pay for).

A pick is an index into a prompt's N answers; accuracy is the verifier's score of the picked answer (the oracle
pick is the first correct answer, or the first answer when none is), so all three are read the same way.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

from torch import Tensor

from posttrain.rollout.samplers import Sampled
from posttrain.tasks import Example, Task

Scorer = Callable[[list[str | None], list[float], Tensor], int]  # (parsed answers, correctness, mean log-probs) -> index
PICKS = ("oracle", "vote", "likelihood")


def oracle_pick(parsed: list[str | None], correct: list[float], mean_logp: Tensor) -> int:
    return next((i for i, c in enumerate(correct) if c >= 1.0), 0)


def vote_pick(parsed: list[str | None], correct: list[float], mean_logp: Tensor) -> int:
    counts = Counter(p for p in parsed if p is not None)
    if not counts:
        return 0
    top = max(counts.values())
    return next(i for i, p in enumerate(parsed) if p is not None and counts[p] == top)


def likelihood_pick(parsed: list[str | None], correct: list[float], mean_logp: Tensor) -> int:
    return int(mean_logp.argmax())


SCORERS: dict[str, Scorer] = {"oracle": oracle_pick, "vote": vote_pick, "likelihood": likelihood_pick}


def auc(scores: Tensor, labels: Tensor) -> float:
    """How well `scores` rank the right answers (label > 0.5) above the wrong ones: P(score of a right answer > score of
    a wrong one), ties counting half; NaN without both kinds."""
    pos, neg = scores[labels > 0.5], scores[labels <= 0.5]
    if not len(pos) or not len(neg):
        return float("nan")
    diff = pos[:, None] - neg[None, :]
    return float((diff > 0).float().mean() + 0.5 * (diff == 0).float().mean())


def mean_logp(sampled: Sampled) -> Tensor:
    """[rows] mean log-prob per produced token of each answer, as the sampler recorded it."""
    mask = sampled.samples.completion_mask.float()
    return (sampled.samples.logp * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)


def best_of_n(sampled: Sampled, task: Task, examples: Sequence[Example], picks: Sequence[str]) -> dict[str, list[int]]:
    """For each scorer in `picks`, the index (row of `sampled`) of the answer it keeps for each prompt."""
    n, finished, scores = sampled.per_prompt, sampled.samples.finished.tolist(), mean_logp(sampled).cpu()
    chosen: dict[str, list[int]] = {name: [] for name in picks}
    for p, example in enumerate(examples):
        rows = range(p * n, (p + 1) * n)
        texts = [sampled.texts[r] for r in rows]
        parsed = [task.parse(t) for t in texts]
        correct = [task.correctness_reward(t, finished[r], example) for t, r in zip(texts, rows)]
        for name in picks:
            chosen[name].append(p * n + SCORERS[name](parsed, correct, scores[p * n : (p + 1) * n]))
    return chosen


def best_of_n_metrics(prefix: str, sampled: Sampled, task: Task, examples: Sequence[Example], picks: Sequence[str]) -> dict[str, float]:
    """`<prefix>_<pick>_accuracy` per scorer, `<prefix>_n` and `<prefix>_forward_tokens_per_prompt` (all N draws)."""
    finished = sampled.samples.finished.tolist()
    out = {f"{prefix}_n": float(sampled.per_prompt), f"{prefix}_forward_tokens_per_prompt": sampled.total_forward_tokens / max(len(examples), 1)}
    for name, rows in best_of_n(sampled, task, examples, picks).items():
        solved = [task.correctness_reward(sampled.texts[r], finished[r], examples[p]) for p, r in enumerate(rows)]
        out[f"{prefix}_{name}_accuracy"] = sum(solved) / max(len(solved), 1)
    return out
