"""The reward-model / RL prompt split (data/preferences.py `split_by_prompt`, `reward_model_prompts`): a disjoint reward
model learns from pairs whose prompts RL never asks, in reward_model_rl and in the reward_model / rl_rm stages."""

from __future__ import annotations

import pytest

from helpers import REPO


def test_reward_model_pairs_on_the_disjoint_half_hold_no_rl_prompt():
    from posttrain import resolve
    from posttrain.data.preferences import split_by_prompt
    from posttrain.stages.preference import load_pairs
    from posttrain.tasks import build_task

    cfg = resolve.load(REPO / "params.yaml", ["task.n_train=400", "task.n_heldout=50", "reward_model.data=task_pairs",
                                              "reward_model.n_pairs=400", "reward_model.n_heldout_pairs=20"])
    task = build_task(cfg.task)
    train, held = task.splits(0)["train"], task.splits(0)["heldout"]
    rl_side, rm_side = split_by_prompt(train, 0)
    rl = {e.prompt for e in rl_side}
    assert len(rl_side) == len(rm_side) == 200 and rl.isdisjoint(e.prompt for e in rm_side)
    assert sorted(e.prompt for e in rl_side + rm_side) == sorted(e.prompt for e in train)
    assert split_by_prompt(train, 0) == (rl_side, rm_side) and split_by_prompt(train, 1) != (rl_side, rm_side)  # drawn with the seed
    disjoint, _ = load_pairs(cfg, cfg.reward_model, task, rm_side, held)
    same, _ = load_pairs(cfg, cfg.reward_model, task, rl_side, held)
    assert disjoint and not rl & {p.prompt for p in disjoint}  # no RL prompt in the disjoint RM's training data
    assert same and {p.prompt for p in same} <= rl


def test_the_pipeline_setting_splits_the_reward_model_and_rl_prompts(tmp_path):
    """reward_model.prompts (default disjoint): the reward_model stage's pairs and rl_rm's RL prompts come from the two
    halves of split_by_prompt (`same`: every prompt for both), and rl_rm stops with one line when the reward model's
    training pairs ask an RL prompt."""
    from posttrain import resolve
    from posttrain.data.preferences import PreferencePair, reward_model_prompts, split_by_prompt, write_pairs
    from posttrain.errors import UserError
    from posttrain.stages.rl_rm import rl_prompts
    from posttrain.tasks import build_task

    cfg = resolve.load(REPO / "params.yaml", ["task.n_train=60", "task.n_heldout=10", "pipeline.seed=3"])
    assert cfg.reward_model.prompts == "disjoint"
    train = build_task(cfg.task).splits(0)["train"]
    rm, rl = reward_model_prompts(train, "disjoint", 3)
    assert (rl, rm) == split_by_prompt(train, 3) and {e.prompt for e in rl}.isdisjoint(e.prompt for e in rm)
    assert reward_model_prompts(train, "same", 3) == (train, train)

    rm_dir = tmp_path / "reward_model"
    rm_dir.mkdir()
    write_pairs(rm_dir / "pairs_train.jsonl", [PreferencePair(e.prompt, e.completion, "0", 1.0, None) for e in rm])
    assert rl_prompts(cfg, rm_dir, train) == rl  # RL on the half the reward model never saw
    write_pairs(rm_dir / "pairs_train.jsonl", [PreferencePair(e.prompt, e.completion, "0", 1.0, None) for e in train[:5]])
    asked = len({e.prompt for e in train[:5]} & {e.prompt for e in rl})
    assert asked > 0
    with pytest.raises(UserError, match=f"reward_model.prompts=disjoint: {asked} of the RL prompts") as err:
        rl_prompts(cfg, rm_dir, train)  # a reward model trained with prompts=same
    assert "\n" not in str(err.value)
    same = resolve.load(REPO / "params.yaml", ["task.n_train=60", "task.n_heldout=10", "pipeline.seed=3", "reward_model.prompts=same"])
    assert rl_prompts(same, rm_dir, train) == train
