"""torchrun on CPU (2 processes, Gloo) with `training.sharding: fsdp`: FSDP2 shards the SFT policy (each rank holds
about half of its parameters), activation checkpointing on; the saved model equals the single-process one, and a
run resumed from a gathered checkpoint ends with the uninterrupted run's weights, bit for bit. RL shards the policy
and its frozen reference the same way (rollouts on the gathered policy): the run equals the replicated 2-process run
(which rolls out the same prompts on each rank with the same draws) and resumes bit for bit."""

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
    staging, killed = _killed_at(1, "sft", "outputs/sft_resumed", tmp_path)
    assert [p.name for p in staging.iterdir()] == ["step-000001"], killed.stderr[-3000:]
    resumed = _torchrun("sft", "--set", "training.sharding=fsdp", "--out", "outputs/sft_resumed", "--resume", cwd=tmp_path)
    assert "resumed sft at step 1" in resumed.stderr
    again = _weights(tmp_path / "outputs/sft_resumed/model")
    assert again.keys() == fsdp.keys() and all(torch.equal(again[k], fsdp[k]) for k in fsdp)


def test_fsdp_refuses_what_it_cannot_shard_with_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    micro_params(tmp_path, task={"n_train": 20, "n_heldout": 4}, sft={"steps": 1, "batch_size": 4, "checkpoint_every": 0},
                 rl={"steps": 1, "prompts_per_step": 1, "group_size": 2})
    posttrain_in_process("data")
    code, _, err = posttrain_main(monkeypatch, capsys, "sft", "--set", "training.sharding=fsdp", "--set", "model.lora.r=2")
    assert code != 0 and err.strip().splitlines()[-1].endswith("does not support LoRA (model.lora.r > 0); use training.sharding=replicate")
    posttrain_in_process("sft")
    for setting, refused in [("model.lora.r=2", "does not support LoRA (model.lora.r > 0)"),
                             ("rl.mode=async", "does not support rl.mode async"),
                             ("rl.preset=ppo", "does not support a critic (the gae advantage, the value term)")]:
        code, _, err = posttrain_main(monkeypatch, capsys, "rl", "--set", "training.sharding=fsdp", "--set", setting)
        last = err.strip().splitlines()[-1]
        assert code != 0 and refused in last and last.endswith("use training.sharding=replicate"), (setting, err[-2000:])
    code, _, err = posttrain_main(monkeypatch, capsys, "eval", "--in", "model=outputs/sft", "--set", "training.sharding=fsdp")
    assert code != 0 and "supported by the rl and sft stages only so far" in err.strip().splitlines()[-1]


RL = {"steps": 3, "prompts_per_step": 4, "group_size": 4, "checkpoint_every": 1, "log_every": 1, "beta": 0.1, "lr": 0.005,
      "warmup_steps": 0, "eval_every": 2, "eval_prompts": 10,  # the held-out check decodes on the gathered policy too
      "max_new_tokens": 12}  # room to end early: ranks whose longest completion differs draw different counts of numbers


@pytest.fixture(scope="module")
def fsdp_rl(tmp_path_factory) -> Path:
    """A short SFT policy (one process), then 3 RL steps under torchrun with fsdp: a KL term to the sharded reference
    (rl.beta 0.1), activation checkpointing on, 2 decoder layers, a checkpoint every step, a held-out check."""
    root = tmp_path_factory.mktemp("fsdp_rl")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        micro_params(root, task={"n_train": 60, "n_heldout": 10}, sft={"steps": 150, "batch_size": 16},
                     model={"gradient_checkpointing": True, "layers": 2}, rl=RL)
        posttrain_in_process("data")
        posttrain_in_process("sft")
    started = time.perf_counter()
    _torchrun("rl", "--set", "training.sharding=fsdp", "--out", "outputs/rl_fsdp", cwd=root)
    print(f"2-process FSDP rl: {time.perf_counter() - started:.1f} s")
    return root


@pytest.mark.slow
def test_fsdp_rl_equals_the_replicated_run_with_half_the_policy_and_reference_per_rank(fsdp_rl):
    started = time.perf_counter()
    _torchrun("rl", "--out", "outputs/rl_replicate", cwd=fsdp_rl)
    print(f"2-process replicated rl: {time.perf_counter() - started:.1f} s")
    fsdp, replicated = _weights(fsdp_rl / "outputs/rl_fsdp/model"), _weights(fsdp_rl / "outputs/rl_replicate/model")
    start = _weights(fsdp_rl / "outputs/sft/model")
    assert fsdp.keys() == replicated.keys() == start.keys()  # a plain checkpoint, keyed as the one it started from
    assert max(float((replicated[k] - start[k]).abs().max()) for k in start) > 1e-3  # the steps moved the weights
    # Adam divides each element's step by its gradient's scale, so an element whose gradient is ~0 (float noise: the
    # replicas' reference reads the shared-prompt path, the sharded one the model's forward) can move by a fraction of
    # lr in one run and not the other: a few elements differ by up to ~4e-5 (against steps of ~1e-2), the rest by ~1e-7
    differences = torch.cat([(fsdp[k] - replicated[k]).abs().flatten() for k in replicated])
    assert float(differences.max()) < 1e-4 and float((differences > 1e-6).float().mean()) < 1e-3, float(differences.max())
    histories = [json.loads((fsdp_rl / f"outputs/{out}/history.json").read_text()) for out in ("rl_fsdp", "rl_replicate")]
    assert [len(h) for h in histories] == [3, 3]
    for key in ("reward/total_mean", "loss", "kl", "grad_norm", "heldout_accuracy"):  # the same rollouts, losses, KL, gradients (averaged), greedy answers
        assert [h.get(key, -1.0) for h in histories[0]] == pytest.approx([h.get(key, -1.0) for h in histories[1]], rel=1e-4, abs=1e-6), key
    assert histories[0][-1]["kl"] > 0 and "heldout_accuracy" in histories[0][-1]  # the policy moved off its reference
    metrics = json.loads((fsdp_rl / "outputs/rl_fsdp/metrics.json").read_text())
    total = metrics["parameters"]
    print(f"parameters {total:.0f}; rank 0 holds {metrics['local_parameters']:.0f} of the policy (the largest shard "
          f"{metrics['largest_local_parameters']:.0f}) and {metrics['reference_local_parameters']:.0f} of the reference "
          f"(the largest {metrics['reference_largest_local_parameters']:.0f})")
    for model in ("", "reference_"):  # about half each, of both models (dim-0 shards: uneven rows differ by one)
        assert 0.45 * total <= metrics[f"{model}local_parameters"] <= metrics[f"{model}largest_local_parameters"] <= 0.55 * total


@pytest.mark.slow
def test_fsdp_rl_resumed_after_a_kill_equals_the_uninterrupted_run(fsdp_rl):
    # SIGKILLed on rank 0 once checkpoint 2 (gathered weights and optimizer state, each rank's generator) is on disk
    # (tests/async_record.py), then `--resume`: every rank re-shards it and runs step 3
    started = time.perf_counter()
    staging, killed = _killed_at(2, "rl", "outputs/rl_resumed", fsdp_rl)
    assert sorted(p.name for p in staging.iterdir()) == ["step-000001", "step-000002"], killed.stderr[-3000:]
    generators = torch.load(staging / "step-000002/trainer.pt", weights_only=True)["parts"]["trainer"]["generator"]
    assert len(generators) == 2 and not torch.equal(*generators)  # the ranks' draws differed: each resumes its own
    resumed = _torchrun("rl", "--set", "training.sharding=fsdp", "--out", "outputs/rl_resumed", "--resume", cwd=fsdp_rl)
    print(f"killed and resumed 2-process FSDP rl: {time.perf_counter() - started:.1f} s")
    assert "resumed rl at step 2" in resumed.stderr
    uninterrupted, again = _weights(fsdp_rl / "outputs/rl_fsdp/model"), _weights(fsdp_rl / "outputs/rl_resumed/model")
    assert again.keys() == uninterrupted.keys() and all(torch.equal(again[k], uninterrupted[k]) for k in uninterrupted)
    histories = [json.loads((fsdp_rl / f"outputs/{out}/history.json").read_text()) for out in ("rl_fsdp", "rl_resumed")]
    assert [h["loss"] for h in histories[1]] == [h["loss"] for h in histories[0]]


def _killed_at(checkpoint: int, stage: str, out: str, cwd: Path) -> tuple[Path, subprocess.CompletedProcess]:
    """`stage` under torchrun with fsdp into `out`, SIGKILLed on rank 0 the moment checkpoint `checkpoint` is on disk
    (tests/async_record.py); its staging directory's checkpoints and the finished process."""
    killer = [str(TORCHRUN), "--standalone", "--nproc_per_node", "2", str(Path(__file__).parents[1] / "async_record.py"),
              stage, "--set", "training.sharding=fsdp", "--out", out]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ASYNC_KILL_AT": str(checkpoint), "ASYNC_RECORD": str(cwd / "record.jsonl")}
    killed = subprocess.run(killer, cwd=cwd, capture_output=True, text=True, timeout=600, env=env)
    assert killed.returncode != 0
    return cwd / "outputs" / f".{Path(out).name}.partial" / "checkpoints", killed
