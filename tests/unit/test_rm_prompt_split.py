"""reward_model_rl's prompt split (data/preferences.py `split_by_prompt`): a disjoint reward model learns from pairs
whose prompts RL never asks."""

from __future__ import annotations

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
