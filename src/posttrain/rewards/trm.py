"""`trm`: a generative Thinking Reward Model ("Think Before You Score", TRM + PD-GRPO, 2026; derived from its abstract) as an RL reward.

The TRM is a causal LM that reads `response + <judge> + prompt` and writes, in the fixed format of
`objectives/pd_grpo.py`,

    <rubric>what the answer to this prompt should be</rubric><assessment>the response checked against it</assessment><score>x</score>

For a verifiable task the case-adaptive rubric is the TRM's own solution of the prompt (the prompt comes last, so
the rubric is written where the policy it starts from writes its answer) and the assessment marks each character
of the response (right-aligned) `y` where it agrees with the rubric and `n` where it does not; x in [0, score_max]. Its vocabulary is the policy's plus the format's tags and marks (added tokens), so any
policy completion can be judged. As an RL reward (`rl.rewards: [{name: trm}]`) each completion is judged once,
greedily, and scores x / score_max; an output that does not parse scores 0 (never an error).
Settings: rl.options.trm.path, the `reward_model` stage's output directory (reward_model.kind: trm).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import torch
from pydantic import Field
from torch import Tensor

from posttrain.config import Section
from posttrain.errors import UserError
from posttrain.objectives.pd_grpo import margin_rewards, parsed_scores, pd_grpo_rewards
from posttrain.rewards import reward_models, rewards

JUDGE = "<judge>"  # ends the TRM's prompt: what follows is its judgement
TAGS = ("<rubric>", "</rubric>", "<assessment>", "</assessment>", "<score>", "</score>")
MARKS = ("y", "n")  # assessment: the response's character agrees / disagrees with the rubric's
SETTINGS_FILE = "trm.json"  # saved next to the weights: score_max and the judgement's token budget
SCORE_CHUNK = 512


JUDGE_TASK = "trm_judge"  # what the pairwise training rewards judge: TRM prompts built from preference pairs


class TRMOptions(Section):  # rl.options.trm
    path: str  # the reward_model stage's output directory (holding model/)


class TRMModelOptions(Section):  # reward_model.options.trm; the section's steps / batch_size / lr: the format SFT warm-up
    pairwise_reward: Literal["pd_grpo", "pairwise_margin"]  # PD-GRPO, or the plain margin-paying pairwise baseline
    warmup_rubric: Literal["preferred", "own"]  # the warm-up's rubric: the pair's preferred answer, or the SFT model's own
    rl_steps: int = Field(ge=0)  # pairwise RL steps after the warm-up (0: warm-up only)
    pairs_per_step: int = Field(gt=0)
    group_size: int = Field(ge=2)  # G rollouts per candidate: 2G per pair
    max_new_tokens: int = Field(gt=0)  # the judgement's token budget
    temperature: float = Field(gt=0)
    lr: float = Field(gt=0)  # the RL phase's learning rate
    alpha_format: float = Field(ge=0)
    score_max: int = Field(gt=0)


def add_format_tokens(tokenizer) -> int:
    """Give `tokenizer` the separator, tags and marks as whole tokens; returns how many were new."""
    return tokenizer.add_tokens([JUDGE, *TAGS, *MARKS])


def judge_prompt(prompt: str, response: str) -> str:
    return f"{response}{JUDGE}{prompt}"


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


@torch.no_grad()
def judge(model, tokenizer, prompts: Sequence[str], responses: Sequence[str], score_max: float, max_new_tokens: int) -> tuple[Tensor, Tensor, list[str]]:
    """Greedy judgements of each (prompt, response): (scores [N], 0 where unparseable; parseable [N]; texts)."""
    from posttrain.models.sampling import sample
    from posttrain.models.sampling import decode_completions
    from posttrain.models.sampling import encode_prompts

    device = next(model.parameters()).device
    scores, valid, texts = [], [], []
    for s in range(0, len(prompts), SCORE_CHUNK):
        ids, mask = encode_prompts(tokenizer, [judge_prompt(p, r) for p, r in zip(prompts[s : s + SCORE_CHUNK], responses[s : s + SCORE_CHUNK])], device)
        out = sample(model, ids, mask, group_size=1, max_new_tokens=max_new_tokens, eos_id=tokenizer.eos_token_id,
                     pad_id=tokenizer.pad_token_id, greedy=True)
        chunk = decode_completions(tokenizer, out)
        score, ok = parsed_scores(chunk, score_max)
        scores.append(score), valid.append(ok & out.finished.cpu()), texts.extend(chunk)
    valid_all = torch.cat(valid)
    return torch.where(valid_all, torch.cat(scores), 0.0), valid_all, texts


def score_summary(scores: Tensor, valid: Tensor, score_max: float) -> dict[str, float]:
    """How graded the judgements are: std of the parseable scores, the share at either end of the scale."""
    s = scores[valid]
    if s.numel() == 0:
        return {"score_std": 0.0, "score_extreme_fraction": 0.0, "score_mean": 0.0, "parse_rate": 0.0}
    return {"score_std": float(s.std()) if s.numel() > 1 else 0.0, "score_mean": float(s.mean()),
            "score_extreme_fraction": float(((s == 0) | (s == score_max)).float().mean()), "parse_rate": float(valid.float().mean())}


@functools.lru_cache(maxsize=4)
def _load(path: str, stamp: float):
    from posttrain.models import load_pretrained, select_device

    model, tokenizer = load_pretrained(path)
    settings = json.loads((Path(path) / SETTINGS_FILE).read_text())
    return model.to(select_device("auto")).eval().requires_grad_(False), tokenizer, settings


def load_trm(directory: str):
    """(model, tokenizer, settings) under `directory/model` (cached while unchanged); UserError if absent."""
    path = Path(directory) / "model"
    if not (path / "config.json").is_file() or not (path / SETTINGS_FILE).is_file():
        raise UserError(f"rl.options.trm.path: no trained TRM at {path} (run the reward_model stage with reward_model.kind=trm)")
    return _load(str(path.resolve()), (path / "config.json").stat().st_mtime)


@rewards.register("trm", needs=("rl",), options=TRMOptions)
def trm_reward(task, examples, completions, finished, *, rl) -> Tensor:
    """The TRM's greedy pointwise score / score_max; 0 for a judgement that does not parse."""
    model, tokenizer, settings = load_trm(rl.options_for("trm").path)
    scores, _, _ = judge(model, tokenizer, [e.prompt for e in examples], list(completions), settings["score_max"], settings["max_new_tokens"])
    return scores / settings["score_max"]


def train_trm(cfg, policy_dir: Path, train, heldout, out_dir: Path, seed: int, on_log) -> dict[str, float]:
    """The reward_model stage's `trm` trainer (trainers/trm.py: format SFT warm-up, then pairwise RL)."""
    from posttrain.trainers import trm

    return trm.train_trm(cfg, policy_dir, train, heldout, out_dir, seed, on_log)


reward_models.register("trm", options=TRMModelOptions)(train_trm)


def _pairwise(rule, task, examples, completions, finished) -> Tensor:
    """Rewards of TRM rollouts grouped by pair: example.answer is `<pair id>:w` (judging the preferred response)
    or `<pair id>:l`; `rule(s_w, ok_w, s_l, ok_l)` pays the rollouts of one pair. Unfinished output is unparseable."""
    scores, valid = parsed_scores(list(completions), task.score_max)
    valid &= torch.tensor(list(finished), dtype=torch.bool)
    rows: dict[str, dict[str, list[int]]] = {}
    for i, e in enumerate(examples):
        pair, side = e.answer.rsplit(":", 1)
        rows.setdefault(pair, {"w": [], "l": []})[side].append(i)
    out = torch.zeros(len(completions))
    for group in rows.values():
        w, l = torch.tensor(group["w"], dtype=torch.long), torch.tensor(group["l"], dtype=torch.long)
        out[w], out[l] = rule(scores[w], valid[w], scores[l], valid[l])
    return out


@rewards.register("pd_grpo", tasks=(JUDGE_TASK,))
def pd_grpo_reward(task, examples, completions, finished) -> Tensor:
    """PD-GRPO (pairwise dual-group RPO): each rollout's side of the other group's median score + alpha_format * format."""
    return _pairwise(lambda *g: pd_grpo_rewards(*g, task.alpha_format), task, examples, completions, finished)


@rewards.register("pairwise_margin", tasks=(JUDGE_TASK,))
def pairwise_margin_reward(task, examples, completions, finished) -> Tensor:
    """The plain pairwise baseline: each rollout's margin over the other group's mean score + alpha_format * format."""
    return _pairwise(lambda *g: margin_rewards(*g, task.score_max, task.alpha_format), task, examples, completions, finished)
