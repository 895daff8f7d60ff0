"""CARE's rubric task (Context-Adaptive Rubric Evolution, derived from the 2026 abstract; docs/reward_models.md): write, for a dialogue context (recipes/care/dialogue.py),
weights over three empathy dimensions, `c=2,a=6,p=2` (cognitive / affective / proactive, in any positive units,
renormalised; the long form `cognitive=0.2 affective=0.6 proactive=0.2` parses too). A judge scores a reply on each
dimension in [0, 1]; the turn reward is the weighted sum, and a rubric is right when it ranks the human-preferred
reply higher:

    w = parse(rubric text), clipped >= 0 and renormalised (uniform 1/3 when unparseable or all zero)
    R_t = sum_d w_d s_d  in [0, 1]          q = 1[ R_t(a_w) > R_t(a_l) ]

Invariants: w on the simplex and R_t in [0, 1]; uniform weights reproduce the static-rubric mean; q = 1 exactly
when the rubric ranks the preferred reply higher; a weight-parse failure falls back to uniform.

`RubricTask` is the task the rubric generator is trained on (recipes/care/trainer.py, stage `care`), its
data simulated with known truth and known flaws:
  - rubric labels: annotators write w*(state, turn) in tenths, but with `care.label_bias: turn_blind` they
    ignore the turn (they always write the turn-1 row), and `care.label_noise` of the labels have one tenth
    moved between two dimensions;
  - human preferences: per context, `care.pairs_per_context` pairs of replies ordered by their true quality
    Q* = w* . s (ties skipped), each flipped with probability `care.preference_flip`.
Its settings are the `care` section (not `task`), so it is built directly, not through the task registry.
`generate_rubrics` is a generator model's greedy rubric per context; the `care` RL reward (recipes/care/reward.py)
applies R_t with those weights, and the trainer measures them with `rubric_quality`.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Sequence

import torch
from torch import Tensor

from posttrain.rollout.sampling import generate
from posttrain.recipes.care import dialogue as D
from posttrain.tasks.base import Example, Task

DIMENSIONS = ("cognitive", "affective", "proactive")
_WEIGHT = re.compile(r"\b(cognitive|affective|proactive|c|a|p)\s*[=:]\s*(-?[0-9]*\.?[0-9]+(?:e-?[0-9]+)?)")
_SHORT = dict(zip("cap", DIMENSIONS))


def parse_rubric(text: str) -> tuple[Tensor, bool]:
    """([3] weights on the simplex, parsed): uniform 1/3 and False when a dimension is missing, a value is not
    finite, or every weight is <= 0; negative weights are clipped to 0 before renormalising."""
    found = {_SHORT.get(name, name): float(value) for name, value in _WEIGHT.findall(text)}
    if set(found) != set(DIMENSIONS) or not all(math.isfinite(v) for v in found.values()):
        return torch.full((3,), 1.0 / 3), False
    weights = torch.tensor([max(found[d], 0.0) for d in DIMENSIONS])
    total = float(weights.sum())
    return (weights / total, True) if total > 0 else (torch.full((3,), 1.0 / 3), False)


def parse_rubric_weights(text: str) -> Tensor:
    """[3] weights (cognitive, affective, proactive) from text like `cognitive=0.5 affective: 0.3 proactive=0.2`."""
    return parse_rubric(text)[0]


def format_rubric(tenths) -> str:
    """The generator's compact rubric text for integer weights (cognitive, affective, proactive)."""
    return ",".join(f"{short}={int(v)}" for short, v in zip("cap", tenths))


def turn_reward(weights: Tensor, scores: Tensor) -> Tensor:
    """R_t = sum_d w_d s_d for scores [..., 3] in [0, 1]."""
    return (weights * scores.clamp(0.0, 1.0)).sum(-1)


def rubric_preference_reward(weights: Tensor, preferred_scores: Tensor, rejected_scores: Tensor) -> Tensor:
    """q = 1 when the rubric's turn reward ranks the human-preferred reply strictly higher, else 0."""
    return (turn_reward(weights, preferred_scores) > turn_reward(weights, rejected_scores)).float()


RUBRIC_CHARS = "cap=,0123456789"
RUBRIC_TOKENS = 12  # "c=2,a=6,p=2" + EOS


def candidate_replies() -> list[str]:
    """Replies that fully cover two dimensions, or one fully and the other two half: the trade-offs a rubric decides."""
    m = D.DIMENSION_MOVES
    two = [2 * m[i] + 2 * m[j] for i in range(3) for j in range(i + 1, 3)]
    spread = [2 * m[i] + "".join(m[j] for j in range(3) if j != i) for i in range(3)]
    return two + spread


def human_pairs(context: str, n: int, flip: float, rng: random.Random) -> list[tuple[str, str]]:
    """(preferred, rejected) replies: the higher true quality wins, flipped with probability `flip`."""
    replies, pairs = candidate_replies(), []
    while len(pairs) < n:
        a, b = rng.sample(replies, 2)
        qa, qb = D.true_quality(context, a), D.true_quality(context, b)
        if abs(qa - qb) < 1e-9:
            continue
        better, worse = (a, b) if qa > qb else (b, a)
        pairs.append((worse, better) if rng.random() < flip else (better, worse))
    return pairs


def annotator_label(context: str, bias: str, noise: float, rng: random.Random) -> str:
    """A turn-level rubric label in tenths: w*, or the turn-1 row when `bias` is turn_blind; with probability
    `noise` one tenth moves from one dimension to another."""
    turns = D.parse_context(context)
    tenths = list(D.IDEAL_TENTHS[turns[-1][0]][0 if bias == "turn_blind" else len(turns) - 1])
    if rng.random() < noise:
        src = rng.choice([d for d in range(3) if tenths[d] > 1])
        tenths[src] -= 1
        tenths[rng.choice([d for d in range(3) if d != src])] += 1
    return format_rubric(tenths)


def true_rubric(context: str) -> str:
    return format_rubric(round(10 * w) for w in D.ideal_weights(context))


def encode_pairs(pairs: Sequence[tuple[str, str]]) -> str:
    return ";".join(f"{w}/{l}" for w, l in pairs)


def decode_pairs(answer: str) -> list[tuple[str, str]]:
    return [tuple(p.split("/")) for p in answer.split(";") if p]


def pair_scores(pairs: Sequence[tuple[str, str]]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor([D.judge_scores(w) for w, _ in pairs]), torch.tensor([D.judge_scores(l) for _, l in pairs])


class RubricTask(Task):
    """Write a rubric for a dialogue context; the verifier is the human preferences at that context (`answer`
    holds them as `w/l;w/l`). An unparseable rubric is scored with uniform weights (CARE's fallback) and
    earns no format reward. `cfg` is the `care` section."""

    def splits(self, seed: int) -> dict[str, list[Example]]:
        c = self.cfg
        rng = random.Random(seed)
        # a different random stream from the dialogue task's splits, so its held-out dialogues are not simply reused here
        contexts = D.distinct_contexts(c.n_sft + c.n_preference + c.n_heldout, 1_000_003 + seed)
        sft, pref, held = contexts[: c.n_sft], contexts[c.n_sft : c.n_sft + c.n_preference], contexts[c.n_sft + c.n_preference :]
        label = lambda ctx: annotator_label(ctx, c.label_bias, c.label_noise, rng)  # noqa: E731
        prefs = lambda ctx, flip: encode_pairs(human_pairs(ctx, c.pairs_per_context, flip, rng))  # noqa: E731
        return {
            "sft": [Example(ctx, label(ctx), "") for ctx in sft],
            "train": [Example(ctx, label(ctx), prefs(ctx, c.preference_flip)) for ctx in pref],
            # held-out pairs carry the true order (no flips): they measure the rubric, not the annotators
            "heldout": [Example(ctx, true_rubric(ctx), prefs(ctx, 0.0)) for ctx in held],
        }

    def parse(self, completion: str) -> str | None:
        return completion if parse_rubric(completion)[1] else None

    def correctness_reward(self, completion: str, finished: bool, example: Example) -> float:
        """q = 1[R_t(a_w) > R_t(a_l)] under the written rubric, averaged over the context's pairs."""
        weights, _ = parse_rubric(completion if finished else "")
        preferred, rejected = pair_scores(decode_pairs(example.answer))
        return float(rubric_preference_reward(weights, preferred, rejected).mean())

    def alphabet(self) -> str:
        return D.ALPHABET + RUBRIC_CHARS


@torch.no_grad()
def generate_rubrics(model, tokenizer, prompts: Sequence[str], batch_size: int = 512) -> list[str]:
    """The generator's greedy rubric text for each prompt ("" where it did not end within the rubric's budget)."""
    out, texts = generate(model, tokenizer, list(prompts), RUBRIC_TOKENS, greedy=True, chunk=batch_size)
    return [t if f else "" for t, f in zip(texts, out.finished.tolist())]


def weight_error(rubric: str, context: str) -> float:
    """0.5 |w - w*|_1 (total variation) between the rubric's parsed weights and the context's true weights."""
    return 0.5 * float((parse_rubric(rubric)[0] - torch.tensor(D.ideal_weights(context))).abs().sum())


def rubric_quality(rubrics: Sequence[str], examples: Sequence[Example]) -> dict[str, float]:
    """Weight error 0.5 |w - w*|_1, pair accuracy against the true order, top-two agreement and parse rate."""
    error = pair_acc = top2 = parsed = 0.0
    for text, ex in zip(rubrics, examples):
        w, ok = parse_rubric(text)
        truth = torch.tensor(D.ideal_weights(ex.prompt))
        preferred, rejected = pair_scores(decode_pairs(ex.answer))
        error += weight_error(text, ex.prompt)
        pair_acc += float(rubric_preference_reward(w, preferred, rejected).mean())
        top2 += float(set(w.topk(2).indices.tolist()) == set(truth.topk(2).indices.tolist()) and ok)
        parsed += float(ok)
    n = max(len(examples), 1)
    return {"weight_error": error / n, "pair_accuracy": pair_acc / n, "top2_agreement": top2 / n, "parse_rate": parsed / n}
