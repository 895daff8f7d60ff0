"""Every training stage resumes bit-for-bit: run straight through in one directory; in another, SIGKILLed right after
a checkpoint (which one is drawn by a seeded generator; in the later phase of a two-phase stage too), then
`--resume`d: equal weights, history and metrics, no staging directory left. The GRPO rl stage, distill and flow_rl
have their own kill tests (tests/integration/test_resume.py, tests/recipes/image/test_flow_resume.py); the rl stage's PPO
preset is here (a trained critic: its weights in outputs/rl/critic and its optimiser group resume with the policy's),
and so is RFPO's `critic` pretraining. The runs go through the CLI in
this process and the killed run is a fork of it (helpers.kill_resume_and_compare), so a case takes seconds."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from helpers import MICRO_CARE, MICRO_CRITIC, MICRO_EDIT, MICRO_IMAGE, MICRO_PAIRS, MICRO_TRM, fork_safe_params, kill_resume_and_compare

pytestmark = pytest.mark.slow
EVERY = 2


@dataclass(frozen=True)
class Case:
    stage: str
    sections: dict
    inputs: dict[str, str]  # input name -> fixture, subpath
    kills: tuple[tuple[str, int], ...]  # (checkpoint folder in the staging directory, step) the kill may follow


TEXT = {"data": ("pipeline_outputs", "outputs/data"), "policy": ("pipeline_outputs", "outputs/sft")}
FIRST_THREE = tuple(("checkpoints", s) for s in (2, 4, 6))
# two-phase stages (then 6 steps of RL in checkpoints/rl): killed in RL, the resumed run restores the first phase's
# last step (checkpointed too), runs none of it and still ends equal (a kill within the first phase is the sft case)
LATER_PHASE = (("checkpoints/rl", 2), ("checkpoints/rl", 4))
CASES = {
    "sft": Case("sft", {"sft": {"steps": 8, "checkpoint_every": EVERY, "log_every": 2}}, {"data": TEXT["data"]}, FIRST_THREE),
    "reward_model_bt": Case("reward_model", {"reward_model": {**MICRO_PAIRS, "steps": 8, "checkpoint_every": EVERY, "log_every": 2}},
                            TEXT, FIRST_THREE),
    # a warm-up long enough for judgements that parse when sampled cool: pairwise RL then has rewards to tell apart
    "reward_model_trm": Case("reward_model", {"reward_model": {
        **MICRO_PAIRS, "kind": "trm", "data": "task_pairs", "n_pairs": 12, "n_heldout_pairs": 4, "steps": 30, "lr": 0.01, "log_every": 10,
        "checkpoint_every": EVERY, "rl_rewards": [{"name": "trm"}],
        "options": {"trm": {**MICRO_TRM, "rl_steps": 6, "group_size": 4, "temperature": 0.3}}}}, TEXT, LATER_PHASE),
    # ABC-Align keeps an EMA of alpha across steps (every 2 steps re-estimated): the objective's state must resume too
    "preference": Case("preference", {"preference": {
        **MICRO_PAIRS, "objective": "abc_align", "steps": 8, "checkpoint_every": EVERY,
        "options": {"abc_align": {"every": 2, "ema": 0.5, "fixed_alpha": None}}}},
        TEXT, FIRST_THREE),
    "flow_sft": Case("flow_sft", {**MICRO_IMAGE, "flow_sft": {**MICRO_IMAGE["flow_sft"], "steps": 8, "checkpoint_every": EVERY}},
                     {"data": ("image_outputs", "curate")}, FIRST_THREE),
    # GLIME replays earlier edits (the memory of records, drawn by the generator): both are in the checkpoint
    "edit": Case("edit", {"edit": {**MICRO_EDIT, "n_edits": 6, "steps_per_edit": 2, "checkpoint_every": EVERY}},
                 {"base": ("knowledge_outputs", "knowledge")}, (("checkpoints", 2), ("checkpoints", 4))),
    "care": Case("care", {"care": {**MICRO_CARE, "sft_steps": 4, "rl_steps": 6, "checkpoint_every": EVERY}}, {}, LATER_PHASE),
    # PPO: the critic trains from step 1 with the policy frozen for the first warm-up update, so a kill at step 2 or 4
    # catches both phases of the optimiser (the critic's group alone, then both) in the checkpoint
    "rl_ppo": Case("rl", {"rl": {"preset": "ppo", "steps": 6, "checkpoint_every": EVERY, "log_every": 1,
                                 "critic": {"path": None, "lr": 0.0005, "warmup_steps": 1}}}, TEXT, FIRST_THREE[:2]),
    # RFPO's success critic: labelled rollouts are sampled again on resume (seeded), the minibatch draw is checkpointed
    "critic": Case("critic", {"critic": {**MICRO_CRITIC, "checkpoint_every": EVERY}}, TEXT, FIRST_THREE[:2]),
    "knowledge": Case("knowledge", {"edit": {**MICRO_EDIT, "pretrain": {**MICRO_EDIT["pretrain"], "steps": 8, "checkpoint_every": EVERY}}},
                      {}, FIRST_THREE),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_killed_stage_resumes_bit_for_bit(name, request, tmp_path):
    case = CASES[name]
    sections = case.sections
    if name == "preference":
        sections = {"preference": {**sections["preference"], "pairs": str(request.getfixturevalue("gold_pairs"))}}
    args = [arg for key, (fixture, sub) in case.inputs.items() for arg in ("--in", f"{key}={request.getfixturevalue(fixture) / sub}")]
    folder, step = random.Random(f"resume/{name}").choice(case.kills)
    roots = [tmp_path / "straight", tmp_path / "resumed"]
    for root in roots:
        root.mkdir()
        fork_safe_params(root, **sections)
    finished = "checkpoints" if folder != "checkpoints" else None  # a kill in the second phase: the first is done
    kill_resume_and_compare(*roots, case.stage, args, kill_at=step, checkpoints=folder, in_process=True, finished=finished)
    if name == "rl_ppo":  # the critic is among the weights compared: saved with the policy, on both sides
        assert all(sorted((root / "outputs" / "rl" / "critic").glob("*.safetensors")) for root in roots)
