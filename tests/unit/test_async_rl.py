"""`rl.mode: async` (trainers/async_rl.py) on a micro model with two worker processes: the deterministic schedule is
bit-exact across runs and across an interruption and resume, interrupted rollouts carry two versions, the pool policy
rejects, and a dead worker or a stalled weight sync ends the run with one line within the timeout.
The same loop under torchrun (rollout ranks): tests/smoke/test_async_torchrun.py."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

import pytest
import torch

from helpers import micro_rl_parts
from posttrain import resolve
from posttrain.errors import UserError
from posttrain.trainers.online_rl import RLRun
from posttrain.trainers.rl import train_online_rl

RL = ["rl.max_new_tokens=4", "rl.prompts_per_step=3", "rl.group_size=3", "rl.overlong_buffer=3",
      "rl.rewards=[{name: correctness}, {name: overlong}]", "rl.mode=async", "rl.workers.count=2", "rl.workers.deterministic=true",
      "rl.workers.queued_groups=4", "rl.workers.refresh_every_tokens=2", "rl.pool_policy=pace", "rl.correction=decoupled",
      "rl.steps=4", "rl.checkpoint_every=1", "rl.warmup_steps=0"]


@pytest.fixture(scope="module")
def micro(tmp_path_factory):
    return micro_rl_parts(tmp_path_factory.mktemp("async"), RL, 30)


def train(micro, directory, resume=False, on_step=None, **rl_updates):
    cfg, task, examples, tokenizer, state, model = micro
    model.load_state_dict(state)
    rl = resolve.updated(cfg.rl, "rl", **rl_updates)
    run = RLRun(model, tokenizer, task, examples, rl, seed=0, checkpoint_dir=directory, config_hash="x")
    history, _ = train_online_rl(run, resume, on_log=lambda step, m: None, on_step=on_step)
    return history, {k: v.detach().clone() for k, v in model.state_dict().items()}


def no_workers_left():
    return not [p for p in multiprocessing.active_children() if p.name.startswith("rollout-worker")]


def test_deterministic_async_is_off_policy_and_resumes_bit_exactly(micro, tmp_path):
    history, straight = train(micro, tmp_path / "straight")
    assert no_workers_left()
    first, later = history[0], history[1:]
    assert first["async/token_lag_max"] == 0 and first["mismatch/k3"] < 1e-9  # block 1 is decoded under version 0 only
    for h in later:  # block k decodes 2 tokens under k - 2 and continues under k - 1: interrupted rollouts, tagged
        assert h["async/token_lag_max"] == 1 and 0 < h["pool/Gp_mean"] < h["pool/Gn_mean"] == 1
        assert h["mismatch/k3"] > 0 and h["mismatch/max_ratio"] > 1  # the trainer is one version ahead of the prefix
        assert h["pool/occupancy"] == 4 and h["pool/rejected_groups"] == 1  # PACE: P = 4 > P* = 3
        assert "decoupled/weight_mean" in h
    assert any(h["advantage_abs_mean"] > 0 for h in history)
    assert max(float((straight[k] - v).abs().max()) for k, v in micro[4].items()) > 1e-4

    def interrupt(step, result):
        if step == 3:  # after update 3, before its checkpoint: the run stops with blocks 4 and 5 in flight
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(micro, tmp_path / "resumed", on_step=interrupt)
    assert sorted(p.name for p in (tmp_path / "resumed").glob("step-*")) == ["step-000001", "step-000002"]
    resumed_history, resumed = train(micro, tmp_path / "resumed", resume=True)
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)  # another process tree, the same bits
    wall = ("async/wait_s", "tokens_per_s")
    assert [{k: v for k, v in h.items() if k not in wall} for h in history] == [{k: v for k, v in h.items() if k not in wall} for h in resumed_history]
    assert no_workers_left()


def kill_a_worker(step, result):
    if step > 1:  # free-running, the trainer may draw once more from what is pooled before it looks
        return
    worker = next(p for p in multiprocessing.active_children() if p.name == "rollout-worker-0")
    os.kill(worker.pid, signal.SIGKILL)
    worker.join(timeout=5)  # dead before the trainer looks again: the next receive must see it, however busy the queue


@pytest.mark.parametrize("deterministic", [True, False])
def test_a_dead_worker_ends_the_run_with_one_line(micro, tmp_path, deterministic):
    start = time.monotonic()
    with pytest.raises(UserError, match=r"^rl.mode async: rollout worker 0 died \(exit code -9\)$"):
        train(micro, tmp_path, on_step=kill_a_worker, workers=micro[0].rl.workers.model_copy(update={"deterministic": deterministic}))
    assert time.monotonic() - start < 30 and no_workers_left()


def test_a_stalled_weight_sync_ends_the_run_within_the_timeout(micro, tmp_path):
    def stall(step, result):
        if step == 1:
            time.sleep(1.6)  # version 1 is out; block 3 decodes 2 tokens under it, then waits in vain for version 2

    start = time.monotonic()
    with pytest.raises(UserError, match=r"rollout worker \d failed: TimeoutError: weight sync: version \d was not published within 1s"):
        train(micro, tmp_path, on_step=stall, workers=micro[0].rl.workers.model_copy(update={"timeout_s": 1.0}))
    assert time.monotonic() - start < 30 and no_workers_left()


def test_async_refuses_what_it_does_not_support(micro, tmp_path):
    with pytest.raises(UserError, match="rl.workers.queued_groups"):
        train(micro, tmp_path, workers=micro[0].rl.workers.model_copy(update={"queued_groups": 2}))
    with pytest.raises(UserError, match="dynamic_sampling"):
        train(micro, tmp_path, dynamic_sampling=True)


def test_free_running_resume_neither_loses_nor_repeats_a_prompt(micro, tmp_path):
    """Interrupted after update 3 (checkpoint 2 on disk) and resumed: every prompt handed out is trained once, or is
    still pooled or in flight at the last checkpoint (step 3 of the resumed run)."""
    from collections import Counter

    from posttrain.trainers.online_rl import PromptStream

    free = micro[0].rl.workers.model_copy(update={"deterministic": False})
    trained: list[str] = []

    def record(step, result, stop_at=None):
        if stop_at is not None and step == stop_at:
            raise KeyboardInterrupt
        trained.extend(e.prompt for e in result.prompts)

    unfiltered = {"workers": free, "pool_policy": "none"}  # nothing rejected: every prompt is trained or still waiting
    with pytest.raises(KeyboardInterrupt):
        train(micro, tmp_path, on_step=lambda s, r: record(s, r, stop_at=3), **unfiltered)
    history, _ = train(micro, tmp_path, resume=True, on_step=lambda s, r: record(s, r) if s == 3 else None, **unfiltered)
    assert len(history) == 4 and len(trained) == 3 * 3
    state = torch.load(tmp_path / "step-000003" / "trainer.pt", weights_only=True)["parts"]["async"]
    examples = micro[2]
    left = [examples[j["example"]].prompt for j in state["pending"]]
    left += [examples[p["example"]].prompt for p in state["payloads"].values()]
    handed_out = [e.prompt for e in PromptStream(examples, 0).take(state["next_number"])]
    assert Counter(trained) + Counter(left) == Counter(handed_out)
    assert no_workers_left()


def test_async_refuses_multi_turn_tasks_with_one_line(micro):
    """Refused in `check_async`: a task that samples multi-turn episodes (torchrun is served by rollout ranks)."""
    from posttrain.trainers import async_rl

    cfg, task = micro[0], micro[1]

    class Episodes:
        def sampler(self, tokenizer):
            raise AssertionError("never sampled")

    with pytest.raises(UserError, match=r"^rl.mode async: task Episodes samples multi-turn episodes; use rl.mode sync$"):
        async_rl.check_async(cfg.rl, Episodes)
    async_rl.check_async(cfg.rl, type(task))  # the micro config itself passes


@pytest.mark.parametrize("correction", ["rejection", "icepop", "sampler_is", "opsm", "m2po"])
def test_catalogue_corrections_run_async_and_log_the_mismatch_every_step(micro, tmp_path, correction):
    """The 2026 catalogue's corrections in rl.mode async (stale tokens: the trainer is a version ahead): every step logs
    k3, the min / max ratio and the masked share, and the correction's own figures."""
    history, _ = train(micro, tmp_path / correction, correction=correction, steps=3, checkpoint_every=0)
    assert no_workers_left()
    for h in history:
        assert {"mismatch/k3", "mismatch/min_ratio", "mismatch/max_ratio", "mismatch/masked_share"} <= set(h)
        assert 0.0 <= h["mismatch/masked_share"] <= 1.0
        assert any(k.startswith(f"{correction}/") for k in h), sorted(h)
    assert any(h["mismatch/k3"] > 0 for h in history[1:])
