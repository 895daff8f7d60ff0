"""torchrun on CPU (2 processes, Gloo) with `training.sharding: fsdp`: FSDP2 shards the SFT policy (each rank holds
about half of its parameters), activation checkpointing on; the saved model equals the single-process one, and a
run resumed from a gathered checkpoint ends with the uninterrupted run's weights, bit for bit."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import torch

from helpers import micro_params, posttrain_in_process, posttrain_main
from test_distributed import TORCHRUN, _torchrun, _weights, _weights_of_a_fresh_model

TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}  # the same two updates, up to the order of floating-point sums


@pytest.mark.slow
def test_fsdp_sft_equals_the_single_process_update_with_half_the_parameters_per_rank(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sft = {"steps": 3, "batch_size": 8, "log_every": 1, "warmup_steps": 0, "checkpoint_every": 1}
    micro_params(tmp_path, task={"n_train": 60, "n_heldout": 10}, sft=sft, model={"gradient_checkpointing": True})
    posttrain_in_process("data")
    posttrain_in_process("sft", "--out", "outputs/sft_one")
    started = time.perf_counter()
    _torchrun("sft", "--set", "training.sharding=fsdp", "--out", "outputs/sft_fsdp", cwd=tmp_path)
    print(f"2-process FSDP sft: {time.perf_counter() - started:.1f} s")
    one, fsdp = _weights(tmp_path / "outputs/sft_one/model"), _weights(tmp_path / "outputs/sft_fsdp/model")
    assert one.keys() == fsdp.keys()
    start = _weights_of_a_fresh_model(tmp_path)
    assert max(float((one[k] - start[k]).abs().max()) for k in one) > 1e-3  # the steps moved the weights
    for key in one:
        torch.testing.assert_close(fsdp[key], one[key], **TOLERANCE, msg=key)
    metrics = json.loads((tmp_path / "outputs/sft_fsdp/metrics.json").read_text())
    total, local, largest = metrics["parameters"], metrics["local_parameters"], metrics["largest_local_parameters"]
    print(f"parameters {total:.0f}; rank 0 holds {local:.0f}, the largest shard {largest:.0f}")
    assert 0.45 * total <= local <= largest <= 0.55 * total  # about half each (dim-0 shards: uneven rows differ by one)

    # resume: the same run SIGKILLed on rank 0 once checkpoint 1 (weights and optimizer state gathered whole) is on
    # disk (tests/async_record.py), then `--resume`: every rank re-shards it and runs steps 2-3
    killer = [str(TORCHRUN), "--standalone", "--nproc_per_node", "2", str(Path(__file__).parents[1] / "async_record.py"),
              "sft", "--set", "training.sharding=fsdp", "--out", "outputs/sft_resumed"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ASYNC_KILL_AT": "1", "ASYNC_RECORD": str(tmp_path / "record.jsonl")}
    killed = subprocess.run(killer, cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    assert killed.returncode != 0
    staging = tmp_path / "outputs/.sft_resumed.partial/checkpoints"
    assert [p.name for p in staging.iterdir()] == ["step-000001"], killed.stderr[-3000:]
    resumed = _torchrun("sft", "--set", "training.sharding=fsdp", "--out", "outputs/sft_resumed", "--resume", cwd=tmp_path)
    assert "resumed sft at step 1" in resumed.stderr
    again = _weights(tmp_path / "outputs/sft_resumed/model")
    assert again.keys() == fsdp.keys() and all(torch.equal(again[k], fsdp[k]) for k in fsdp)


def test_fsdp_refuses_lora_and_rl_with_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    micro_params(tmp_path, task={"n_train": 20, "n_heldout": 4}, sft={"steps": 1, "batch_size": 4, "checkpoint_every": 0},
                 rl={"steps": 1, "prompts_per_step": 1, "group_size": 2})
    posttrain_in_process("data")
    code, _, err = posttrain_main(monkeypatch, capsys, "sft", "--set", "training.sharding=fsdp", "--set", "model.lora.r=2")
    assert code != 0 and err.strip().splitlines()[-1].endswith("does not support LoRA (model.lora.r > 0); use training.sharding=replicate")
    posttrain_in_process("sft")
    code, _, err = posttrain_main(monkeypatch, capsys, "rl", "--set", "training.sharding=fsdp")
    assert code != 0 and "supported by the sft stage only" in err.strip().splitlines()[-1]
