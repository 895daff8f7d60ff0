"""The multi-turn environment API, the key-room text world, and observation-token masking."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from posttrain import resolve
from posttrain.envs.rollout import multi_turn_sample
from posttrain.envs.text_world import KeyRoom, goal_of, replay, shortest_actions, transcript
from posttrain.tasks.text_world import TextWorld, hint
from posttrain.rollout.sampling import decode_completions

PARAMS = Path(__file__).resolve().parents[2] / "params.yaml"


def world(n_train=60, n_heldout=20):
    return TextWorld(SimpleNamespace(name="text_world", n_train=n_train, n_heldout=n_heldout))


def test_reset_step_reaches_the_goal_only_by_stopping_on_it():
    env = KeyRoom("c0>")
    assert env.reset() == "c0>"
    goal = goal_of("c")
    for _ in range(goal):
        step = env.step("r")
        assert not step.done and step.reward == 0.0
    assert step.observation == f"{goal}>"
    assert env.step("s") == type(step)("", 1.0, True)
    env.reset()
    wrong = env.step("l") if goal == 0 else env.step("s")
    assert wrong.reward == 0.0
    assert KeyRoom("c0>").step("x").done  # anything else ends the episode


def test_splits_are_disjoint_and_every_reference_passes_the_verifier():
    task = world()
    splits = task.splits(0)
    assert not {e.prompt for e in splits["train"]} & {e.prompt for e in splits["heldout"]}
    for e in splits["train"] + splits["heldout"]:
        assert task.correctness_reward(e.completion, True, e) == 1.0 and task.parse(e.completion) is not None
        assert set(e.prompt + e.completion) <= set(task.alphabet())
    with pytest.raises(Exception, match="exceeds"):
        world(70, 20).splits(0)


def test_hint_names_the_goal_and_replay_matches_the_environment():
    e = world().splits(0)["train"][0]
    assert hint(e) == f"g{goal_of(e.prompt[0])}"
    for start in range(5):
        actions = shortest_actions(start, goal_of("h"))
        assert replay("h", start, actions) and replay("h", start, transcript(start, actions))
        assert not replay("h", start, actions[:-1])


def test_multi_turn_rollout_masks_observation_tokens_out_of_the_loss():
    from posttrain.models import build_tiny, train_char_tokenizer

    task = world()
    tokenizer = train_char_tokenizer([task.alphabet()])
    cfg = resolve.load(PARAMS, ["model.hidden_size=32", "model.intermediate_size=64", "model.layers=1"])
    torch.manual_seed(0)
    model = build_tiny(cfg.model, tokenizer)
    envs = [KeyRoom(p) for p in ("a0>", "b1>", "c2>", "d3>")]
    first = [env.reset() for env in envs]
    samples = multi_turn_sample(model, tokenizer, envs, first, max_tokens=12, generator=torch.Generator().manual_seed(0))
    for row, env in enumerate(envs):
        ids, mask, logp = samples.completion_ids[row].tolist(), samples.completion_mask[row].tolist(), samples.logp[row]
        # rebuild the expected mask: after each l/r the env writes "<cell>>" (2 tokens the policy did not produce)
        expected, pos, t = [], env.start, 0
        while t < len(ids) and (mask[t] or ids[t] != tokenizer.pad_token_id):
            action = tokenizer.decode([ids[t]])
            expected.append(1)
            t += 1
            if action in ("l", "r"):
                pos = min(max(pos + (1 if action == "r" else -1), 0), 4)
                assert tokenizer.decode(ids[t : t + 2]) == f"{pos}>"
                expected += [0, 0]
                t += 2
        assert mask[: len(expected)] == expected and not any(mask[len(expected):])
        assert (logp[torch.tensor(mask) == 0] == 0).all() and (logp[torch.tensor(mask) == 1] <= 0).all()
    assert any(0 in row for row in samples.completion_mask.tolist())  # some observation was appended
    texts = decode_completions(tokenizer, samples)
    for row, text in enumerate(texts):  # the rewards read the policy's tokens only
        kept = samples.completion_ids[row][samples.completion_mask[row] == 1]
        assert text == tokenizer.decode(kept, skip_special_tokens=True)
