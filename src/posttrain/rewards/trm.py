"""`trm`: a generative Thinking Reward Model ("Think Before You Score", TRM + PD-GRPO, 2026; derived from its abstract) as an RL reward.

The TRM is a causal LM that reads `response + <judge> + prompt` and writes, in the fixed format of
`objectives/pd_grpo.py`,

    <rubric>what the answer to this prompt should be</rubric><assessment>the response checked against it</assessment><score>x</score>

For a verifiable task the case-adaptive rubric is the TRM's own solution of the prompt (the prompt comes last, so
the rubric is written where the policy it starts from writes its answer) and the assessment marks each character
of the response (right-aligned) `y` where it agrees with the rubric and `n` where it does not; x in [0, score_max].
Its vocabulary is the policy's plus the format's tags and marks (added tokens), so any policy completion can be
judged. The `reward_model` stage trains it (trainers/trm.py). As an RL reward (`rl.rewards: [{name: trm}]`) each
completion is judged once, greedily, and scores x / score_max; an output that does not parse scores 0 (never an error).
Settings: rl.options.trm.path, the `reward_model` stage's output directory (reward_model.kind: trm).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from posttrain.config import Section
from posttrain.rollout.sampling import generate
from posttrain.objectives.pd_grpo import margin_rewards, parsed_scores, pd_grpo_rewards
from posttrain.rewards import rewards
from posttrain.rewards.trained import load_trained

JUDGE = "<judge>"  # ends the TRM's prompt: what follows is its judgement
TAGS = ("<rubric>", "</rubric>", "<assessment>", "</assessment>", "<score>", "</score>")
MARKS = ("y", "n")  # assessment: the response's character agrees / disagrees with the rubric's
SETTINGS_FILE = "trm.json"  # saved next to the weights: score_max and the judgement's token budget
SCORE_CHUNK = 512


JUDGE_TASK = "trm_judge"  # what the pairwise training rewards judge: TRM prompts built from preference pairs


class TRMOptions(Section):  # rl.options.trm
    path: str = "outputs/reward_model"  # the reward_model stage's output directory (holding model/)


def judge_prompt(prompt: str, response: str) -> str:
    return f"{response}{JUDGE}{prompt}"


@torch.no_grad()
def judge(model, tokenizer, prompts: Sequence[str], responses: Sequence[str], score_max: float, max_new_tokens: int) -> tuple[Tensor, Tensor, list[str]]:
    """Greedy judgements of each (prompt, response): (scores [N], 0 where unparseable; parseable [N]; texts)."""
    out, texts = generate(model, tokenizer, [judge_prompt(p, r) for p, r in zip(prompts, responses)], max_new_tokens, greedy=True,
                          chunk=SCORE_CHUNK)
    scores, valid = parsed_scores(texts, score_max)
    valid &= out.finished.cpu()
    return torch.where(valid, scores, 0.0), valid, texts


def _build(path: str):
    from posttrain.models import load_pretrained, select_device

    model, tokenizer = load_pretrained(path)
    settings = json.loads((Path(path) / SETTINGS_FILE).read_text())
    return model.to(select_device("auto")).eval().requires_grad_(False), tokenizer, settings


def load_trm(directory: str):
    """(model, tokenizer, settings) under `directory/model` (cached while unchanged); UserError if absent."""
    return load_trained(directory, _build, needs=(SETTINGS_FILE,), missing="rl.options.trm.path: no trained TRM at {path} "
                        "(run the reward_model stage with reward_model.kind=trm)")


@rewards.register("trm", needs=("rl",), options=TRMOptions)
def trm_reward(task, examples, completions, finished, *, rl) -> Tensor:
    """The TRM's greedy pointwise score / score_max; 0 for a judgement that does not parse."""
    model, tokenizer, settings = load_trm(rl.options_for("trm").path)
    scores, _, _ = judge(model, tokenizer, [e.prompt for e in examples], list(completions), settings["score_max"], settings["max_new_tokens"])
    return scores / settings["score_max"]


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
