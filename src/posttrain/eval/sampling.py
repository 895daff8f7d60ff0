"""Metrics over k samples per prompt: pass@k and majority@k.

pass@k, the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models Trained on Code",
arXiv 2107.03374, section 2.1): with n samples of which c are correct,

    pass@k = 1 - C(n - c, k) / C(n, k)  =  1 - prod_{i = n-c+1}^{n} (1 - k / i)        (k <= n)

the probability that at least one of k samples drawn without replacement from the n is correct, averaged over
prompts (the product form avoids large binomials). pass@1 = c / n.

majority@n (self-consistency, Wang et al. 2022, arXiv 2203.11171): the answer most of the n samples give (the
task's `parse`; samples without an answer do not vote; a tie goes to the answer given first) is the prompt's
answer; the prompt counts as solved when a sample giving that answer is correct.

A sample is correct when the task's correctness reward is 1 (a partial score, as the rubric task gives, is not).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one prompt with `c` correct samples out of `n` (Chen et al. 2021)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n (n={n}, c={c}, k={k})")
    if n - c < k:  # every draw of k holds a correct sample
        return 1.0
    product = 1.0
    for i in range(n - c + 1, n + 1):
        product *= 1.0 - k / i
    return 1.0 - product


def ks_for(n: int) -> list[int]:
    """The k reported for n samples: 1, 2, 4, ... up to n, and n itself."""
    ks, k = [], 1
    while k < n:
        ks.append(k)
        k *= 2
    return [*ks, n]


def majority_correct(votes: Sequence[tuple[str | None, float]]) -> float:
    """1.0 when the most common parsed answer among `votes` ((answer or None, correct) per sample) is correct."""
    counts = Counter(answer for answer, _ in votes if answer is not None)
    if not counts:
        return 0.0
    top = max(counts.values())
    winner = next(answer for answer, _ in votes if counts.get(answer) == top)  # ties: the answer given first
    return float(next(correct for answer, correct in votes if answer == winner) >= 1.0)


def sample_metrics(per_prompt: Sequence[Sequence[tuple[str | None, float]]]) -> dict[str, float]:
    """`pass_at_<k>` for k in `ks_for(n)` and `majority_at_<n>`, averaged over prompts; each prompt's votes are its
    n samples' (parsed answer, correctness). Keys avoid "@": MLflow refuses it in metric names."""
    if not per_prompt:
        return {}
    n = len(per_prompt[0])
    metrics = {}
    for k in ks_for(n):
        metrics[f"pass_at_{k}"] = sum(pass_at_k(n, sum(c >= 1.0 for _, c in votes), k) for votes in per_prompt) / len(per_prompt)
    metrics[f"majority_at_{n}"] = sum(majority_correct(votes) for votes in per_prompt) / len(per_prompt)
    return metrics
