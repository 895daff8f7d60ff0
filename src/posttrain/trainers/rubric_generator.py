"""CARE's rubric generator (spec §17): a tiny LM that reads a dialogue context (tasks/dialogue.py) and writes
context-adaptive weights `c=2,a=6,p=2` over the cognitive / affective / proactive dimensions.

Two phases, as in the paper's abstract: SFT on turn-level rubric labels, then preference RL on human
preferences. Both data sources are simulated with known truth and known flaws:
  - rubric labels: annotators write w*(state, turn) in tenths, but with `care.label_bias: turn_blind` they
    ignore the turn (they always write the turn-1 row), and `care.label_noise` of the labels have one tenth
    moved between two dimensions;
  - human preferences: per context, `care.pairs_per_context` pairs of replies ordered by their true quality
    Q* = w* . s (ties skipped), each flipped with probability `care.preference_flip`.
Preference RL is the online RL loop (trainers/online_rl.py) with the `rl` section's objective (GRPO by
default) on `RubricTask`, whose verifier is the context's human preferences: the reward of a sampled rubric
is q = 1[R_t(a_w) > R_t(a_l)] averaged over the context's pairs (`correctness`), plus `care.format_weight` x
(the rubric parses). Reported before and after preference RL on held-out contexts: the weight error
0.5 |w - w*|_1, the pair accuracy (mean q against the true order), the top-two agreement (the two heaviest
dimensions, which decide the best reply) and the parse rate.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from posttrain.config import Config, RewardSpec, SFTConfig
from posttrain.rewards.care import format_rubric, parse_rubric, rubric_preference_reward
from posttrain.tasks import dialogue as D
from posttrain.tasks.base import Example, Task

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
    holds them as `w/l;w/l`). An unparseable rubric is scored with uniform weights (spec §17's fallback) and
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
    """The generator's greedy rubric text for each prompt."""
    from posttrain.models.sampling import sample
    from posttrain.models.sampling import decode_completions
    from posttrain.models.sampling import encode_prompts

    device, texts = next(model.parameters()).device, []
    for s in range(0, len(prompts), batch_size):
        ids, mask = encode_prompts(tokenizer, list(prompts[s : s + batch_size]), device)
        out = sample(model, ids, mask, group_size=1, max_new_tokens=RUBRIC_TOKENS, eos_id=tokenizer.eos_token_id,
                     pad_id=tokenizer.pad_token_id, greedy=True)
        texts += [t if f else "" for t, f in zip(decode_completions(tokenizer, out), out.finished.tolist())]
    return texts


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


def train_rubric_generator(
    cfg: Config, out_dir: Path, on_log: Callable[[int, dict[str, float]], None]
) -> tuple[dict[str, float], list[dict[str, float]], list[dict[str, object]]]:
    """SFT then preference RL of a tiny generator (sizes from `model`); saves it to out_dir/model. Returns
    (metrics, RL history, a table of held-out rubrics after training)."""
    from posttrain.models import build_tiny, save_pretrained, select_device, train_char_tokenizer
    from posttrain.models.sampling import encode_prompts
    from posttrain.trainers.common import seed_everything
    from posttrain.trainers.online_rl import RLRun, train_online_rl
    from posttrain.trainers.sft import train_sft

    c, seed = cfg.care, cfg.pipeline.seed
    task = RubricTask(c)
    data = task.splits(seed)
    seed_everything(seed)
    tokenizer = train_char_tokenizer([task.alphabet()])
    model = build_tiny(cfg.model, tokenizer).to(select_device(cfg.pipeline.device))
    sft_cfg = SFTConfig(steps=c.sft_steps, batch_size=c.batch_size, lr=c.sft_lr, warmup_steps=c.warmup_steps, weight_decay=0.0,
                        max_grad_norm=c.max_grad_norm, n_examples=0, log_every=c.log_every)
    train_sft(model, tokenizer, data["sft"], sft_cfg, seed, on_log=lambda step, m: on_log(step, {f"sft/{k}": v for k, v in m.items()}))
    held = data["heldout"]
    metrics = {"weight_error_labels": sum(weight_error(e.completion, e.prompt) for e in data["sft"]) / len(data["sft"])}
    metrics |= {f"{k}_uniform": v for k, v in rubric_quality([""] * len(held), held).items() if k in ("weight_error", "pair_accuracy")}
    metrics |= {f"{k}_sft": v for k, v in rubric_quality(generate_rubrics(model, tokenizer, [e.prompt for e in held]), held).items()}
    rewards = (RewardSpec(name="correctness", weight=1.0), RewardSpec(name="format", weight=c.format_weight))
    rl_cfg = cfg.rl.model_copy(update={
        "rewards": rewards, "steps": c.rl_steps, "prompts_per_step": c.rl_prompts_per_step, "group_size": c.rl_group_size,
        "max_new_tokens": RUBRIC_TOKENS, "lr": c.rl_lr, "warmup_steps": 0, "checkpoint_every": 0, "log_every": c.log_every,
    })
    run = RLRun(policy=model, tokenizer=tokenizer, task=task, examples=data["train"], cfg=rl_cfg, seed=seed,
                checkpoint_dir=out_dir / "checkpoints", config_hash=cfg.section_hash("pipeline", "model", "rl", "care"))
    history, _ = train_online_rl(run, False, on_log=lambda step, m: on_log(c.sft_steps + step, {f"rl/{k}": v for k, v in m.items()}))
    after = generate_rubrics(model, tokenizer, [e.prompt for e in held])
    metrics |= rubric_quality(after, held)
    save_pretrained(model, tokenizer, out_dir / "model")
    table = [{"context": e.prompt, "rubric": text, "true_rubric": e.completion} for e, text in list(zip(held, after))[:50]]
    return metrics, history, table
