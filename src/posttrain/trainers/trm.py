"""Training the Thinking Reward Model (spec §9): a short format SFT warm-up, then pairwise RL with PD-GRPO.

The TRM starts from the SFT policy, its vocabulary extended by the format's tokens (rewards/trm.py). Each
preference pair (prompt, y_w, y_l) gives two TRM prompts, one judging y_w and one judging y_l.

1. Warm-up (`reward_model.steps`, `batch_size`, `lr`, `warmup_steps`, `max_grad_norm`): next-token SFT (trainers/sft.py)
   on the judgement `rewards.trm.judgement(y, rubric)` of both candidates, each (response, prompt) once, where the rubric
   is (`options.trm.warmup_rubric`) the pair's preferred answer (`preferred`: reference-guided judging; the TRM
   learns to write the answer the preferences favour, then to check the response against it) or the starting
   model's own greedy answer (`own`: the warm-up then teaches only the format and the checking procedure, not
   which answer is right). The per-position agreement is the assessment, the share of agreeing positions the score.
2. Pairwise RL (`reward_model.options.trm`): the online RL step of trainers/online_rl.py (`policy_step`: sampling,
   the reward registry, the `grpo` estimator, the `clip` loss) on batches of whole pairs, G rollouts on y_w
   (group W) and G on y_l (group L). The reward `pd_grpo` pays each rollout for the side of the other group's
   median it lands on; GRPO's per-prompt normalisation is then PD-GRPO's separate normalisation within W and
   within L. `pairwise_margin` (the baseline) pays the margin over the other group's mean instead.

Held-out pairs are judged greedily: pair accuracy (score(y_w) > score(y_l); ties counted apart), the std of the
scores and the share of scores at either end of the scale.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from posttrain.config import RewardSpec, RLConfig, SFTConfig
from posttrain.data.preferences import PreferencePair
from posttrain.errors import UserError
from posttrain.rewards.trm import JUDGE_TASK, SETTINGS_FILE, add_format_tokens, judge, judge_prompt, judgement, score_summary
from posttrain.tasks import Example


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
    from posttrain.models.sampling import sample
    from posttrain.models.sampling import decode_completions
    from posttrain.models.sampling import encode_prompts

    unique, answers = list(dict.fromkeys(prompts)), []
    for s in range(0, len(unique), 512):
        ids, mask = encode_prompts(tokenizer, unique[s : s + 512], next(model.parameters()).device)
        answers += decode_completions(tokenizer, sample(model, ids, mask, group_size=1, max_new_tokens=max_new_tokens,
                                                        eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id, greedy=True))
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
              on_log: Callable[[int, dict[str, float]], None]) -> dict[str, float]:
    """Warm up and train a TRM from the SFT model at `policy_dir`; save it to out_dir/model; held-out metrics."""
    model, tokenizer = warm_up(cfg, policy_dir, train, heldout, seed, on_log)
    after_warmup = pair_metrics(model, tokenizer, heldout, *_scale(cfg))
    on_log(cfg.reward_model.steps, {f"{k}_warmup": v for k, v in after_warmup.items()})
    final = pairwise_rl(cfg, model, tokenizer, train, heldout, seed, on_log, first_step=cfg.reward_model.steps) or after_warmup
    save_trm(model, tokenizer, out_dir / "model", cfg)
    return {**{f"{k}_warmup": v for k, v in after_warmup.items()}, **final}


def _scale(cfg) -> tuple[int, int]:
    opts = cfg.reward_model.options_for("trm")
    return opts.score_max, opts.max_new_tokens


def warm_up(cfg, policy_dir: Path, train, heldout, seed: int, on_log):
    """The SFT model with the format's tokens added, after the format SFT warm-up: (model, tokenizer)."""
    from posttrain.models import load_pretrained, select_device
    from posttrain.models.sampling import encode_prompts
    from posttrain.trainers.common import seed_everything
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
                       max_grad_norm=rm.max_grad_norm, n_examples=0, log_every=rm.log_every)
    train_sft(model, tokenizer, examples, warmup, seed, on_log=lambda step, m: on_log(step, {f"warmup/{k}": v for k, v in m.items()}))
    return model, tokenizer


def pairwise_rl(cfg, model, tokenizer, train, heldout, seed: int, on_log, first_step: int = 0) -> dict[str, float]:
    """`options.trm.rl_steps` of pairwise RL (`options.trm.pairwise_reward`) on `model`, in place, through the online
    RL step; returns the last held-out metrics ({} when rl_steps is 0)."""
    from posttrain.models.sampling import encode_prompts
    from posttrain.trainers.common import optimizer_and_schedule
    from posttrain.trainers.online_rl import RLRun, policy_step

    rm, opts = cfg.reward_model, cfg.reward_model.options_for("trm")
    if not opts.rl_steps:
        return {}
    examples = judge_examples(train, opts.score_max)
    run = RLRun(model, tokenizer, JudgeTask(opts.score_max, opts.alpha_format), examples, judge_rl_config(cfg.rl, opts), seed,
                Path("unused-checkpoints"), "trm")
    optimizer, schedule = optimizer_and_schedule([p for p in model.parameters() if p.requires_grad], opts.lr, 0.0, 0, opts.rl_steps)
    generator = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    rng, final = random.Random(seed), {}
    model.train()
    for step in range(1, opts.rl_steps + 1):
        picked = rng.sample(range(len(train)), min(opts.pairs_per_step, len(train)))
        result = policy_step(run, [examples[2 * i + side] for i in picked for side in (0, 1)], generator, optimizer, schedule)
        if step % rm.log_every == 0 or step == opts.rl_steps:
            final = pair_metrics(model, tokenizer, heldout, opts.score_max, opts.max_new_tokens)
            keep = ("reward/total_mean", "loss", "entropy", "clip_fraction", "completion_length")
            on_log(first_step + step, {**{f"pairwise/{k}": v for k, v in result.metrics.items() if k in keep}, **final})
    return final


def save_trm(model, tokenizer, path: Path, cfg) -> None:
    score_max, max_new_tokens = _scale(cfg)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    (path / SETTINGS_FILE).write_text(json.dumps({"score_max": score_max, "max_new_tokens": max_new_tokens}))
