"""Crashes at every durable write point (issue 38, item 7): the installed CLI runs the micro sft stage with
`POSTTRAIN_FAULT=<point>[@n]` (posttrain.runtime.fault_point: `os._exit(137)` at that point, as kill -9 would), then
the next run (or `--resume`) must end with the same weights as an uninterrupted run, and nothing already written
(a checkpoint, the previous output, a completed new output) may be lost in between.

Points: inside a checkpoint write (trainers/checkpoint.py: files written, fsynced, renamed into place) and inside the
staging swap (stages/__init__.py `_swap_into_place`: checkpoints dropped, previous output moved aside, new output
renamed into place)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import POSTTRAIN, micro_params

pytestmark = pytest.mark.slow

SFT = ["sft", "--set", "sft.checkpoint_every=1"]


def sft(cwd: Path, *extra: str, fault: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "POSTTRAIN_FAULT"}
    if fault:
        env["POSTTRAIN_FAULT"] = fault
    return subprocess.run([POSTTRAIN, *SFT, *extra], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def weights(model_dir: Path) -> dict:
    from safetensors.torch import load_file

    files = sorted(model_dir.rglob("*.safetensors"))
    assert files, f"no weights under {model_dir}"
    return {f"{f.relative_to(model_dir)}:{k}": v for f in files for k, v in load_file(f).items()}


def same(a: dict, b: dict) -> bool:
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """Micro params (3 sft steps, untracked) and outputs/data: the starting point of every case."""
    from posttrain import resolve
    from posttrain.data import write_examples
    from posttrain.tasks import build_task

    root = tmp_path_factory.mktemp("faults-base")
    cfg = resolve.load(micro_params(root, sft={"steps": 3, "batch_size": 8, "log_every": 1}, tracking={"enabled": False}))
    (root / "outputs" / "data").mkdir(parents=True)
    write_examples(root / "outputs" / "data" / "train.jsonl", build_task(cfg.task).splits(cfg.pipeline.seed)["train"])
    return root


@pytest.fixture(scope="module")
def straight(base, tmp_path_factory) -> dict:
    """The weights of an uninterrupted run."""
    work = tmp_path_factory.mktemp("faults-straight")
    shutil.copytree(base, work, dirs_exist_ok=True)
    result = sft(work)
    assert result.returncode == 0, result.stderr[-3000:]
    return weights(work / "outputs" / "sft" / "model")


@pytest.fixture
def work(base, tmp_path) -> Path:
    shutil.copytree(base, tmp_path, dirs_exist_ok=True)
    return tmp_path


@pytest.mark.parametrize("point", ["checkpoint:written", "checkpoint:fsynced", "checkpoint:renamed"])
def test_a_crash_inside_a_checkpoint_write_resumes_to_the_same_weights(point, work, straight):
    crashed = sft(work, fault=f"{point}@2")  # inside the second checkpoint's write: the first must survive it
    assert crashed.returncode == 137, crashed.stderr[-3000:]
    checkpoints = work / "outputs" / ".sft.partial" / "checkpoints"
    kept = sorted(p.name for p in checkpoints.glob("step-*"))
    assert kept == (["step-000001", "step-000002"] if point == "checkpoint:renamed" else ["step-000001"]), kept
    assert not (work / "outputs" / "sft").exists()

    resumed = sft(work, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed sft at step {len(kept)}" in resumed.stderr, resumed.stderr[-3000:]
    assert same(weights(work / "outputs" / "sft" / "model"), straight)
    assert not list((work / "outputs").glob(".sft.*"))  # no staging, no lock, no .old left


@pytest.mark.parametrize("point", ["swap:checkpoints-dropped", "swap:old-moved", "swap:new-in-place"])
@pytest.mark.parametrize("again", [[], ["--resume"]])
def test_a_crash_inside_the_staging_swap_loses_no_output(point, again, work, straight):
    previous = work / "outputs" / "sft"
    previous.mkdir(parents=True)
    (previous / "previous.txt").write_text("the output of an earlier run")
    crashed = sft(work, fault=point)
    assert crashed.returncode == 137, crashed.stderr[-3000:]
    outputs = work / "outputs"
    # nothing lost: the previous output is in place or moved aside, the new one complete in staging or in place
    new_at = outputs / "sft" if point == "swap:new-in-place" else outputs / ".sft.partial"
    assert same(weights(new_at / "model"), straight)
    assert (outputs / "sft" / "previous.txt").is_file() or (outputs / ".sft.old" / "previous.txt").is_file()

    after = sft(work, *again)
    assert after.returncode == 0, after.stderr[-3000:]
    assert same(weights(outputs / "sft" / "model"), straight) and not (outputs / "sft" / "previous.txt").exists()
    assert not list(outputs.glob(".sft.*"))


@pytest.mark.parametrize("point", ["swap:checkpoints-dropped", "swap:old-moved"])
def test_the_next_start_finishes_an_interrupted_swap_even_when_that_run_fails(point, work, straight):
    """The completed output a crashed swap left in staging is put in place by the next start of that output (before
    its staging directory is cleared), so a next run that then fails (here: it diverges) still leaves it in place."""
    assert sft(work, fault=point).returncode == 137
    failed = sft(work, "--set", "sft.lr=1e12", "--set", "training.max_nonfinite_steps=0")
    assert failed.returncode == 2 and "not finite" in failed.stderr, failed.stderr[-3000:]
    outputs = work / "outputs"
    assert same(weights(outputs / "sft" / "model"), straight) and not (outputs / ".sft.old").exists()
