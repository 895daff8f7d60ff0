"""A diverging stage (learning rate 1e12 on the micro config: one update takes the weights to ~1e12, a forward then
overflows) stops with one line naming the step, exit code 2, and
keeps its last checkpoint in the staging directory; `--resume` with a higher `training.max_nonfinite_steps` then
finishes past the non-finite steps (skipped and counted in `nonfinite_steps`). No checkpoint and no output ever
holds a NaN or infinite weight. Each stage runs through the CLI entry point in this process."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from helpers import MICRO_CARE, MICRO_EDIT, MICRO_IMAGE, MICRO_PAIRS, MICRO_TRM, fork_safe_params, posttrain_main

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Case:
    stage: str
    lr: str  # the key whose learning rate makes the loop diverge
    sections: dict
    inputs: dict[str, tuple[str, str]]  # input name -> (fixture, subpath)
    value: str = "1e12"


TEXT = {"data": ("pipeline_outputs", "outputs/data"), "policy": ("pipeline_outputs", "outputs/sft")}
CASES = {
    "sft": Case("sft", "sft.lr", {"sft": {"steps": 8, "checkpoint_every": 1, "warmup_steps": 0}}, {"data": TEXT["data"]}),
    "reward_model_bt": Case("reward_model", "reward_model.lr", {"reward_model": {**MICRO_PAIRS, "steps": 8, "checkpoint_every": 1}}, TEXT),
    "reward_model_trm": Case("reward_model", "reward_model.lr", {"reward_model": {
        **MICRO_PAIRS, "kind": "trm", "data": "task_pairs", "n_pairs": 12, "n_heldout_pairs": 4, "steps": 8, "checkpoint_every": 1,
        "rl_rewards": [{"name": "trm"}], "options": {"trm": {**MICRO_TRM, "rl_steps": 2}}}}, TEXT),
    "preference": Case("preference", "preference.lr", {"preference": {**MICRO_PAIRS, "steps": 8, "checkpoint_every": 1}}, TEXT),
    "flow_sft": Case("flow_sft", "flow_sft.lr", {**MICRO_IMAGE, "flow_sft": {**MICRO_IMAGE["flow_sft"], "steps": 8, "checkpoint_every": 1}},
                     {"data": ("image_outputs", "curate")}),
    # only the FFNs are edited: at 1e12 the final RMSNorm still brings the residual stream back to finite logits
    "edit": Case("edit", "edit.lr", {"edit": {**MICRO_EDIT, "n_edits": 4, "steps_per_edit": 2, "checkpoint_every": 1}},
                 {"base": ("knowledge_outputs", "knowledge")}, "1e30"),
    "care": Case("care", "care.sft_lr", {"care": {**MICRO_CARE, "sft_steps": 8, "checkpoint_every": 1}}, {}),
    "knowledge": Case("knowledge", "edit.pretrain.lr",
                      {"edit": {**MICRO_EDIT, "pretrain": {**MICRO_EDIT["pretrain"], "steps": 8, "checkpoint_every": 1}}}, {}),
    "rl": Case("rl", "rl.lr", {"rl": {"steps": 8, "checkpoint_every": 1}}, TEXT),
    # flow_rl runs the core RL step: a diverged model's images are NaN, which no judge scores, and more than
    # training.max_unscored_steps such steps in a row would stop the resumed run before it gets past them
    "flow_rl": Case("flow_rl", "flow_rl.lr", {**MICRO_IMAGE, "flow_rl": {**MICRO_IMAGE["flow_rl"], "steps": 8, "checkpoint_every": 1},
                                              "training": {"max_unscored_steps": 100}},
                    {"data": ("image_outputs", "curate"), "policy": ("image_outputs", "flow_sft")}),
}


def finite_weights(directory) -> int:
    """How many weight files under `directory`; asserts each tensor in them is finite."""
    import torch
    from safetensors.torch import load_file

    files = sorted(directory.rglob("*.safetensors"))
    for path in files:
        for name, tensor in load_file(path).items():
            assert torch.isfinite(tensor).all(), f"{path}: {name} holds a NaN or infinite weight"
    return len(files)


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before `optimizer.step\\(\\)`")  # skipped steps: by design
def test_a_diverging_stage_stops_in_one_line_then_resumes_past_it(name, request, tmp_path, monkeypatch, capsys):
    case = CASES[name]
    fork_safe_params(tmp_path, **case.sections)
    monkeypatch.chdir(tmp_path)
    inputs = [a for key, (fixture, sub) in case.inputs.items() for a in ("--in", f"{key}={request.getfixturevalue(fixture) / sub}")]
    args = [case.stage, *inputs, "--set", f"{case.lr}={case.value}"]
    code, _, err = posttrain_main(monkeypatch, capsys, *args, "--set", "training.max_nonfinite_steps=1")
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert "not finite on 2 consecutive steps" in lines[0] and lines[0].startswith("posttrain: error: step "), lines[0]
    staging = tmp_path / "outputs" / f".{case.stage}.partial"
    kept = sorted(staging.rglob("step-*"))
    assert kept, "a checkpoint was written before the divergence: the staging directory must keep it"
    assert f"kept: {kept[-1].relative_to(tmp_path)}" in lines[0] or f"kept: {kept[-1]}" in lines[0], lines[0]
    assert finite_weights(staging) >= len(kept)

    code, out, err = posttrain_main(monkeypatch, capsys, *args, "--set", "training.max_nonfinite_steps=100", "--resume")
    assert code == 0, err[-3000:]
    metrics = json.loads(out.strip().splitlines()[-1])
    assert metrics["nonfinite_steps"] >= 2  # the two of the failed run, restored, and those after them
    assert finite_weights(tmp_path / "outputs" / case.stage) and not staging.exists()
