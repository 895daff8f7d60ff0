"""Training the Thinking Reward Model ("Think Before You Score", 2026): a short format SFT warm-up, then pairwise RL with PD-GRPO.

The TRM starts from the SFT policy, its vocabulary extended by the format's tokens (rewards/trm.py). Each
preference pair (prompt, y_w, y_l) gives two TRM prompts, one judging y_w and one judging y_l.

1. Warm-up (`reward_model.steps`, `batch_size`, `lr`, `warmup_steps`, `max_grad_norm`): next-token SFT (trainers/sft.py)
   on the judgement `judgement(y, rubric)` of both candidates, each (response, prompt) once, where the rubric
   is (`options.trm.warmup_rubric`) the pair's preferred answer (`preferred`: reference-guided judging; the TRM
   learns to write the answer the preferences favour, then to check the response against it) or the starting
   model's own greedy answer (`own`: the warm-up then teaches only the format and the checking procedure, not
   which answer is right). The per-position agreement is the assessment, the share of agreeing positions the score.
2. Pairwise RL (`reward_model.options.trm`): the online RL step of trainers/online_rl.py (`OnlineRL.step`: sampling,
   the reward registry, the `grpo` estimator, the `clip` loss) on batches of whole pairs, G rollouts on y_w
   (group W) and G on y_l (group L). The reward `pd_grpo` pays each rollout for the side of the other group's
   median it lands on; GRPO's per-prompt normalisation is then PD-GRPO's separate normalisation within W and
   within L. `pairwise_margin` (the baseline) pays the margin over the other group's mean instead.

Held-out pairs are judged greedily: pair accuracy (score(y_w) > score(y_l); ties counted apart), the std of the
scores and the share of scores at either end of the scale. `train_trm` is the `reward_model` stage's trainer for
`reward_model.kind: trm` (registered in `rewards.reward_models`); the `trm` RL reward reads what it saves.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from pydantic import Field
from torch import Tensor

from posttrain.config import RewardSpec, RLConfig, Section, SFTConfig
from posttrain.data.preferences import PreferencePair
from posttrain.errors import UserError
from posttrain.rollout.sampling import generate
from posttrain.rewards import reward_models
from posttrain.rewards.trm import JUDGE, JUDGE_TASK, MARKS, SETTINGS_FILE, TAGS, judge, judge_prompt
from posttrain.tasks import Example
from posttrain.trainers.loop import TrainLoop


class TRMModelOptions(Section):  # reward_model.options.trm; the section's steps / batch_size / lr: the format SFT warm-up
    pairwise_reward: Literal["pd_grpo", "pairwise_margin"] = "pd_grpo"  # PD-GRPO, or the plain margin-paying pairwise baseline
    warmup_rubric: Literal["preferred", "own"] = "preferred"  # the warm-up's rubric: the pair's preferred answer, or the SFT model's own
    rl_steps: int = Field(60, ge=0)  # pairwise RL steps after the warm-up (0: warm-up only)
    pairs_per_step: int = Field(8, gt=0)
    group_size: int = Field(8, ge=2)  # G rollouts per candidate: 2G per pair
    max_new_tokens: int = Field(24, gt=0)  # the judgement's token budget
    temperature: float = Field(1.0, gt=0)
    lr: float = Field(0.0001, gt=0)  # the RL phase's learning rate
    alpha_format: float = Field(0.5, ge=0)
    score_max: int = Field(10, gt=0)


def add_format_tokens(tokenizer) -> int:
    """Give `tokenizer` the separator, tags and marks as whole tokens; returns how many were new."""
    return tokenizer.add_tokens([JUDGE, *TAGS, *MARKS])


def assessment(response: str, rubric: str) -> str:
    """One mark per position of the longer of the two, right-aligned (units against units)."""
    width = max(len(response), len(rubric), 1)
    a, b = response.rjust(width, "\0"), rubric.rjust(width, "\0")
    return "".join(MARKS[0] if x == y and x != "\0" else MARKS[1] for x, y in zip(a, b))


def graded_score(marks: str, score_max: float) -> int:
    """The warm-up's pointwise score: the share of agreeing positions, on the integer scale [0, score_max]."""
    return round(score_max * marks.count(MARKS[0]) / len(marks))


def judgement(response: str, rubric: str, score_max: float) -> str:
    """The TRM target text for `response` when the preferred answer is `rubric` (format SFT warm-up)."""
    marks = assessment(response, rubric)
    return f"<rubric>{rubric or '?'}</rubric><assessment>{marks}</assessment><score>{graded_score(marks, score_max)}</score>"


def score_summary(scores: Tensor, valid: Tensor, score_max: float) -> dict[str, float]:
    """How graded the judgements are: std of the parseable scores, the share at either end of the scale."""
    s = scores[valid]
    if s.numel() == 0:
        return {"score_std": 0.0, "score_extreme_fraction": 0.0, "score_mean": 0.0, "parse_rate": 0.0}
    return {"score_std": float(s.std()) if s.numel() > 1 else 0.0, "score_mean": float(s.mean()),
            "score_extreme_fraction": float(((s == 0) | (s == score_max)).float().mean()), "parse_rate": float(valid.float().mean())}


@dataclass(frozen=True)
class JudgeTask:
    """What the pairwise rewards read from the task slot of the RL loop: the score scale and format weight."""

    score_max: float
    alpha_format: float
    name: str = JUDGE_TASK


def judge_examples(pairs: Sequence[PreferencePair], score_max: float, rubrics: dict[str, str] | None = None) -> list[Example]:
    """Rows 2i / 2i+1: the TRM prompts judging pair i's preferred / rejected response; with `rubrics` (prompt ->
    rubric) their warm-up targets, else no target (RL needs none)."""
    return [
        Example(judge_prompt(p.prompt, response), judgement(response, rubrics[p.prompt], score_max) if rubrics else "", f"{i}:{side}")
        for i, p in enumerate(pairs) for side, response in (("w", p.chosen), ("l", p.rejected))
    ]


def preferred_answers(pairs: Sequence[PreferencePair]) -> dict[str, str]:
    """prompt -> its pairs' preferred answer (the reference-guided warm-up rubrics; the first pair's where they differ)."""
    rubrics: dict[str, str] = {}
    for p in pairs:
        rubrics.setdefault(p.prompt, p.chosen)
    return rubrics


def warmup_examples(pairs: Sequence[PreferencePair], score_max: float, rubrics: dict[str, str]) -> list[Example]:
    """The warm-up's judgements, each (response, prompt) once: a preferred answer shared by several pairs of one
    prompt would otherwise be judged (rubric == response) as often as there are pairs."""
    return list({(e.prompt, e.completion): e for e in judge_examples(pairs, score_max, rubrics)}.values())


@torch.no_grad()
def own_answers(model, tokenizer, prompts: Sequence[str], max_new_tokens: int) -> dict[str, str]:
    """prompt -> the model's greedy answer (the warm-up rubrics)."""
    unique = list(dict.fromkeys(prompts))
    _, answers = generate(model, tokenizer, unique, max_new_tokens, greedy=True, chunk=512)
    return dict(zip(unique, answers))


def pair_metrics(model, tokenizer, pairs: Sequence[PreferencePair], score_max: float, max_new_tokens: int) -> dict[str, float]:
    """Greedy judgements of every held-out candidate: pair accuracy, ties and how graded the scores are."""
    prompts = [p.prompt for p in pairs for _ in range(2)]
    scores, valid, _ = judge(model, tokenizer, prompts, [t for p in pairs for t in (p.chosen, p.rejected)], score_max, max_new_tokens)
    both = valid[0::2] & valid[1::2]
    wins = both & (scores[0::2] > scores[1::2])
    ties = both & (scores[0::2] == scores[1::2])
    return {"heldout_pair_accuracy": float(wins.float().mean()), "heldout_pair_ties": float(ties.float().mean()),
            **score_summary(scores, valid, score_max)}


def judge_rl_config(rl: RLConfig, opts) -> RLConfig:
    """The rl settings for pairwise TRM training: GRPO + clip on the chosen pairwise reward, no extras."""
    return rl.model_copy(update={
        "preset": None, "advantage": "grpo", "loss": "clip", "loss_agg": "token_mean", "aux": (),
        "rewards": (RewardSpec(name=opts.pairwise_reward, weight=1.0),), "steps": max(opts.rl_steps, 1),
        "prompts_per_step": 2 * opts.pairs_per_step, "group_size": opts.group_size, "max_new_tokens": opts.max_new_tokens,
        "temperature": opts.temperature, "lr": opts.lr, "warmup_steps": 0, "epochs_per_batch": 1, "std_scaling": "group",
        "beta": 0.0, "dynamic_sampling": False, "checkpoint_every": 0, "options": {},
    })


def check_fits(model, tokenizer, examples: Sequence[Example], max_new_tokens: int) -> None:
    longest = max(len(tokenizer.encode(e.prompt, add_special_tokens=False)) for e in examples)
    limit = model.config.max_position_embeddings
    if longest + max_new_tokens > limit:
        raise UserError(f"reward_model.options.trm.max_new_tokens: a judgement of {longest} prompt tokens + {max_new_tokens} "
                        f"exceeds the model's {limit} positions")


def train_trm(cfg, policy_dir: Path, train: Sequence[PreferencePair], heldout: Sequence[PreferencePair], out_dir: Path, seed: int,
              on_log: Callable[[int, dict[str, float]], None], loop: TrainLoop | None = None) -> dict[str, float]:
    """Warm up and train a TRM from the SFT model at `policy_dir`; save it to out_dir/model; held-out metrics.

    `loop` (trainers/loop.py): the warm-up checkpoints into its directory, its last step included (a resume after
    the warm-up restores its end and runs none of it again), pairwise RL into <directory>/rl; `nonfinite_steps`
    counts the skipped steps of both phases."""
    loop = loop or TrainLoop()
    warmup_loop, rl_loop = loop.phase(save_last=True), loop.phase("rl")
    model, tokenizer = warm_up(cfg, policy_dir, train, heldout, seed, on_log, loop=warmup_loop)
    after_warmup = pair_metrics(model, tokenizer, heldout, *_scale(cfg))
    on_log(cfg.reward_model.steps, {f"{k}_warmup": v for k, v in after_warmup.items()})
    final = pairwise_rl(cfg, model, tokenizer, train, heldout, seed, on_log, cfg.reward_model.steps, rl_loop) or after_warmup
    save_trm(model, tokenizer, out_dir / "model", cfg)
    return {**{f"{k}_warmup": v for k, v in after_warmup.items()}, **final,
            "nonfinite_steps": float(warmup_loop.nonfinite_steps + rl_loop.nonfinite_steps)}


def _scale(cfg) -> tuple[int, int]:
    opts = cfg.reward_model.options_for("trm")
    return opts.score_max, opts.max_new_tokens


def warm_up(cfg, policy_dir: Path, train, heldout, seed: int, on_log, loop: TrainLoop | None = None):
    """The SFT model with the format's tokens added, after the format SFT warm-up (its steps guarded and
    checkpointed by `loop`): (model, tokenizer)."""
    from posttrain.models import load_pretrained, select_device
    from posttrain.runtime import seed_everything
    from posttrain.trainers.sft import train_sft

    rm, (score_max, max_new_tokens) = cfg.reward_model, _scale(cfg)
    model, tokenizer = load_pretrained(policy_dir, cfg.model.dtype)
    add_format_tokens(tokenizer)
    model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    model.to(select_device(cfg.pipeline.device))
    if rm.options_for("trm").warmup_rubric == "own":
        rubrics = own_answers(model, tokenizer, [p.prompt for p in train], rm.sample_tokens)
    else:
        rubrics = preferred_answers(train)
    examples = warmup_examples(train, score_max, rubrics)
    check_fits(model, tokenizer, examples + judge_examples(heldout, score_max), max_new_tokens)
    seed_everything(seed)
    warmup = SFTConfig(steps=rm.steps, batch_size=rm.batch_size, lr=rm.lr, warmup_steps=rm.warmup_steps, weight_decay=0.0,
                       max_grad_norm=rm.max_grad_norm, n_examples=0, log_every=rm.log_every,
                       checkpoint_every=rm.checkpoint_every)
    train_sft(model, tokenizer, examples, warmup, seed, on_log=lambda step, m: on_log(step, {f"warmup/{k}": v for k, v in m.items()}),
              loop=loop)
    return model, tokenizer


def pairwise_rl(cfg, model, tokenizer, train, heldout, seed: int, on_log, first_step: int = 0,
                loop: TrainLoop | None = None) -> dict[str, float]:
    """`options.trm.rl_steps` of pairwise RL (`options.trm.pairwise_reward`) on `model`, in place, through the online
    RL step, its updates guarded and checkpointed by `loop`; returns the last held-out metrics ({} when rl_steps is 0)."""
    from posttrain.trainers.online_rl import OnlineRL, RLRun

    rm, opts = cfg.reward_model, cfg.reward_model.options_for("trm")
    if not opts.rl_steps:
        return {}
    examples = judge_examples(train, opts.score_max)
    run = RLRun(model, tokenizer, JudgeTask(opts.score_max, opts.alpha_format), examples, judge_rl_config(cfg.rl, opts), seed,
                Path("unused-checkpoints"), "trm")
    loop = loop or TrainLoop()
    trainer = OnlineRL(run, total_steps=opts.rl_steps, loop=loop)  # judge_rl_config: beta 0, no reference copied
    rng = random.Random(seed)
    parts = {"trainer": trainer, "pairs": rng}
    start, saved = loop.restore(model, parts)
    final = saved.get("final", {})
    model.train()
    for step in range(start + 1, opts.rl_steps + 1):
        picked = rng.sample(range(len(train)), min(opts.pairs_per_step, len(train)))
        result = trainer.step([examples[2 * i + side] for i in picked for side in (0, 1)])
        if step % rm.log_every == 0 or step == opts.rl_steps:
            final = pair_metrics(model, tokenizer, heldout, opts.score_max, opts.max_new_tokens)
            keep = ("reward/total_mean", "loss", "entropy", "clip_fraction", "completion_length")
            on_log(first_step + step, {**{f"pairwise/{k}": v for k, v in result.metrics.items() if k in keep}, **final})
        loop.checkpoint(step, opts.rl_steps, model, parts, {"final": final})
    return final


def save_trm(model, tokenizer, path: Path, cfg) -> None:
    score_max, max_new_tokens = _scale(cfg)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    (path / SETTINGS_FILE).write_text(json.dumps({"score_max": score_max, "max_new_tokens": max_new_tokens}))


reward_models.register("trm", options=TRMModelOptions)(train_trm)
