"""torchrun on CPU (2 processes, Gloo): the data-parallel SFT update equals the single-process one on the same
total batch, rank 0 alone writes the output and its MLflow run, and online RL keeps its replicas in sync."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from helpers import micro_params, posttrain_in_process

TORCHRUN = Path(sys.executable).with_name("torchrun")
POSTTRAIN = Path(sys.executable).with_name("posttrain")


def _torchrun(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    command = [str(TORCHRUN), "--standalone", "--nproc_per_node", "2", str(POSTTRAIN), *args]
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def _weights(directory: Path) -> dict[str, torch.Tensor]:
    return {k: v for path in sorted(directory.glob("*.safetensors")) for k, v in load_file(path).items()}


@pytest.mark.slow
def test_torchrun_sft_equals_the_single_process_update_and_rl_keeps_replicas_in_sync(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.chdir(tmp_path)
    rl = {"steps": 2, "prompts_per_step": 2, "group_size": 2, "checkpoint_every": 1, "log_every": 1}
    micro_params(tmp_path, task={"n_train": 60, "n_heldout": 10}, sft={"steps": 2, "batch_size": 8, "log_every": 1, "warmup_steps": 0}, rl=rl)
    posttrain_in_process("data")
    posttrain_in_process("sft", "--out", "outputs/sft_one")
    _torchrun("sft", "--out", "outputs/sft_two", cwd=tmp_path)
    one, two = _weights(tmp_path / "outputs/sft_one/model"), _weights(tmp_path / "outputs/sft_two/model")
    assert one.keys() == two.keys()
    start = _weights_of_a_fresh_model(tmp_path)
    moved = max(float((one[k] - start[k]).abs().max()) for k in one)
    assert moved > 1e-3  # the steps changed the weights, so equality below says something
    for key in one:  # the same two updates, up to the order of floating-point sums
        torch.testing.assert_close(two[key], one[key], rtol=1e-5, atol=1e-6, msg=key)
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("posttrain")
    runs = client.search_runs([experiment.experiment_id], "tags.stage = 'sft'")
    assert len(runs) == 2 and {r.info.status for r in runs} == {"FINISHED"}  # one per launch, not one per rank
    assert not list((tmp_path / "outputs").glob(".*"))  # no staging or replica leftovers

    # online RL: each rank rolls out one of the step's two prompts; averaged gradients keep the replicas equal
    # (the trainer checks their checksums at the end and fails if they differ)
    _torchrun("rl", "--in", "policy=outputs/sft_two", "--out", "outputs/rl_two", cwd=tmp_path)
    (rl_run,) = client.search_runs([experiment.experiment_id], "tags.stage = 'rl'")
    assert rl_run.info.status == "FINISHED" and len(json.loads((tmp_path / "outputs/rl_two/history.json").read_text())) == 2


def _weights_of_a_fresh_model(tmp_path: Path) -> dict[str, torch.Tensor]:
    from posttrain import resolve
    from posttrain.models import build_tiny, train_char_tokenizer
    from posttrain.tasks import build_task
    from posttrain.runtime import seed_everything

    cfg = resolve.load(tmp_path / "params.yaml")
    seed_everything(cfg.pipeline.seed)
    model = build_tiny(cfg.model, train_char_tokenizer([build_task(cfg.task).alphabet()]))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}
