"""Mistakes a user can make: each ends with ONE line on stderr, exit code 2, and nothing written or damaged."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from helpers import copy_outputs, micro_params, posttrain


def snapshot(root: Path) -> dict[str, str]:
    """Every file under root (hidden ones included) with its content hash."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def assert_one_line_error(result, *needles: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.fixture
def populated(pipeline_outputs, tmp_path) -> Path:
    """A work dir holding finished data/sft/rl outputs from an earlier run."""
    copy_outputs(pipeline_outputs, tmp_path)
    micro_params(tmp_path)  # same settings, with its own MLflow store
    return tmp_path


CASES = {
    "unknown key": (["rl", "--set", "rl.lrr=0.1"], ["rl.lrr", "did you mean", "rl.lr"]),
    "unknown section": (["sft", "--set", "optimizer.lr=0.1"], ["optimizer"]),
    "wrong type": (["rl", "--set", "rl.steps=abc"], ["rl.steps", "integer"]),
    "negative steps": (["rl", "--set", "rl.steps=-3"], ["rl.steps", "greater than 0"]),
    "unknown objective": (["rl", "--set", "rl.advantage=grpoo"], ["rl.advantage", "grpoo", "did you mean 'grpo'"]),
    "unknown loss": (["rl", "--set", "rl.loss=clipp"], ["rl.loss", "clip"]),
    "unknown reward": (["rl", "--set", "rl.rewards=[{name: corectness}]"], ["corectness", "correctness"]),
    "bad --set syntax": (["rl", "--set", "rl.steps"], ["section.key=value"]),
    "missing params file": (["rl", "--params", "nope.yaml"], ["nope.yaml"]),
    "missing checkpoint path": (["rl", "--in", "policy=no/such/dir"], ["policy", "no/such/dir"]),
    "input without a model": (["eval", "--in", "model=outputs/data"], ["outputs/data/model/config.json"]),
    "unknown input name": (["eval", "--in", "teacher=outputs/sft"], ["teacher"]),
    "missing model.path": (["sft", "--set", "model.path=./no-such-model"], ["no-such-model"]),
    "resume a stage that cannot": (["eval", "--resume"], ["--resume"]),
    "unknown stage": (["trian"], ["trian"]),
    "heads do not divide": (["sft", "--set", "model.heads=3"], ["heads"]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_one_line_exit_2_and_writes_nothing(name, populated):
    args, needles = CASES[name]
    before = snapshot(populated)
    result = posttrain(*args, cwd=populated, check=False)
    assert_one_line_error(result, *needles)
    assert snapshot(populated) == before


def test_invalid_yaml_params(populated):
    (populated / "broken.yaml").write_text("rl: [unclosed\n")
    before = snapshot(populated)
    assert_one_line_error(posttrain("rl", "--params", "broken.yaml", cwd=populated, check=False), "broken.yaml", "YAML")
    assert snapshot(populated) == before


def test_corrupt_dataset_keeps_previous_outputs(populated):
    train = populated / "outputs" / "data" / "train.jsonl"
    train.write_text(train.read_text() + '{"prompt": "12+3=", "completion": \n')
    rl_before = snapshot(populated / "outputs" / "rl")
    result = posttrain("rl", cwd=populated, check=False)
    assert_one_line_error(result, "train.jsonl:201", "not valid JSON")
    assert snapshot(populated / "outputs" / "rl") == rl_before, "the previous rl output must survive a failed run"
    assert not (populated / "outputs" / ".rl.partial").exists()


def test_missing_field_in_dataset(populated):
    heldout = populated / "outputs" / "data" / "heldout.jsonl"
    heldout.write_text(json.dumps({"prompt": "1+2="}) + "\n")
    result = posttrain("eval", "--in", "model=outputs/sft", cwd=populated, check=False)
    assert_one_line_error(result, "heldout.jsonl:1", "expected an object")
    assert not (populated / "outputs" / "eval").exists()
