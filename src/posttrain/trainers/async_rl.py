"""Asynchronous online RL (`rl.mode: async`): rollout worker processes generate whole groups while the trainer updates.

The roles on one machine (docs/async.md says why processes here, and torch.distributed under torchrun beyond it:
trainers/async_dist.py, where rank 0 is this trainer and the other ranks run the same decode loop, `decode_jobs` of trainers/async_decode.py):

- the trainer (this process) owns the policy, the optimiser and the pool (rollout/pool.py). It hands prompts out as
  jobs, pools the completed groups, draws whole groups under `rl.pool_policy`, scores them, takes one `OnlineRL`
  step (the off-policy correction `rl.correction` and the mismatch figures included) and publishes the new weights;
- `rl.workers.count` worker processes (torch.multiprocessing) each hold a copy of the policy. The trainer's weights
  live in shared memory (`SharedWeights`: two slots, the newest version and the one before it, and a version
  counter); a worker loads newer weights between decode steps (`sample(between_steps=...)`), so an interrupted
  rollout continues under the new version and every token is tagged with the version that produced it.

Policy versions: v = the number of updates the trainer has taken; update k trains at v_now = k - 1 and publishes k.

Two schedules:

- free-running (the default): a worker takes the newest weights before every decode step; the trainer keeps
  `rl.workers.queued_groups` jobs outstanding, pools whatever has completed before each update and waits only when
  the pool cannot yet give a batch. Wall-clock races decide the versions.
- deterministic (`rl.workers.deterministic`): a fixed schedule instead of races. The jobs of update k (block k:
  `queued_groups` prompts, handed out after update k - 2) decode their first `refresh_every_tokens` tokens under
  version max(0, k - 2), then wait for and continue under version max(0, k - 1): an interrupted rollout, overlapping
  update k - 1. Before update k the trainer pools exactly block k in prompt order. Each job samples with its own
  generator (seeded by the run's seed and the job's number), so a group does not depend on which worker ran it.
  A checkpoint holds the pool, the jobs not yet pooled (prompt, number, versions), the weights of version v - 1
  (the prefix version of the in-flight block) and the prompt stream; on resume the in-flight jobs are decoded again
  from their start under the same versions, which gives the same tokens: the run resumes bit-exactly.

A worker that dies, fails or stalls, or a weight sync that does not arrive within `rl.workers.timeout_s`, ends the
run with one line (UserError) within that time; the workers are stopped on every exit. The trainer talks to its
workers through a transport (`LocalWorkers` here, `async_dist.RolloutRanks` under torchrun) with one interface:
start, send a job, receive a message, publish weights, stop.
"""

from __future__ import annotations

import contextlib
import copy
import os
import queue
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import torch
import torch.multiprocessing as mp

from posttrain.config import RLConfig
from posttrain.errors import UserError
from posttrain.rollout.sampling import Samples, StopStrings, concat_samples, encode_prompts
from posttrain.rollout.pool import Group, TrajectoryPool, pool_policies
from posttrain.runtime import progress
from posttrain.trainers import distributed
from posttrain.trainers.loop import TrainLoop
from posttrain.trainers.online_rl import OnlineRL, PromptStream, RLRun, StepResult, train_accuracy

from posttrain.trainers.async_decode import NEWEST, Job, Stopped, decode_jobs, worker_settings


class SharedWeights:
    """The policy's state in shared memory: two slots (version v in slot v % 2) and the newest version's number.
    A deterministic schedule reads at most one version behind the newest, so two slots hold everything it reads."""

    def __init__(self, model: torch.nn.Module, ctx):
        state = model.state_dict()
        self.slots = [{k: v.detach().to("cpu", copy=True).share_memory_() for k, v in state.items()} for _ in range(2)]
        self.version = ctx.Value("l", -1)
        self.lock = ctx.Lock()
        self.stopping = ctx.Event()
        self.trainer = os.getpid()  # set by the trainer at the end: a worker waiting for weights leaves

    def publish(self, state: dict[str, torch.Tensor], version: int) -> None:
        with self.lock:
            for key, tensor in self.slots[version % 2].items():
                tensor.copy_(state[key])
            self.version.value = max(self.version.value, version)

    def newest(self) -> int:
        return self.version.value

    def slot(self, version: int) -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in self.slots[version % 2].items()}

    def load(self, model: torch.nn.Module, version: int, timeout: float, beat: Callable[[], None]) -> int:
        """Copy `version` (NEWEST: the newest) into `model`, waiting at most `timeout` s for it to be published."""
        deadline = time.monotonic() + timeout
        while version != NEWEST and self.version.value < version:
            if self.stopping.is_set() or os.getppid() != self.trainer:
                raise Stopped
            if time.monotonic() > deadline:
                raise TimeoutError(f"weight sync: version {version} was not published within {timeout:g}s")
            beat()
            time.sleep(0.001)
        with self.lock:
            newest = self.version.value
            version = newest if version == NEWEST else version
            if newest > version + 1:
                raise RuntimeError(f"weight sync: version {version} was overwritten (newest is {newest})")
            with torch.no_grad():
                for key, tensor in model.state_dict().items():
                    tensor.copy_(self.slots[version % 2][key])
        return version



def worker_main(rank: int, model, tokenizer, examples, settings: dict, shared: SharedWeights, jobs, results, alive) -> None:
    """One rollout worker process on this machine: `decode_jobs` with the shared weights and the queues."""
    trainer = os.getppid()

    def beat() -> None:
        alive[rank] = time.time()

    try:
        decode_jobs(rank, model, tokenizer, examples, settings, shared, jobs, results, beat,
                    stopping=lambda: os.getppid() != trainer or shared.stopping.is_set())
    except Stopped:
        return
    except Exception as e:  # the trainer turns it into one line
        results.put(("error", rank, f"{type(e).__name__}: {e}" if str(e) else traceback.format_exc(limit=1)))
        results.close()
        results.join_thread()  # the line reaches the trainer before this process ends
        os._exit(1)


class LocalWorkers:
    """`rl.workers.count` worker processes on this machine (torch.multiprocessing): jobs and groups through queues,
    the weights in shared memory (`SharedWeights`). trainers/async_dist.RolloutRanks has the same interface."""

    noun = "rollout worker"

    def __init__(self, count: int):
        self.count = count
        self.processes: list = []

    def start(self, run: RLRun, settings: dict, published: list[tuple[int, dict[str, torch.Tensor]]]) -> None:
        policy = run.policy
        ctx = mp.get_context("spawn" if next(policy.parameters()).is_cuda else "fork")
        self.shared = SharedWeights(policy, ctx)
        for version, state in published:
            self.shared.publish(state, version)
        self.jobs, self.results = ctx.Queue(), ctx.Queue()
        self.alive = ctx.Array("d", [time.time()] * self.count)
        worker_model = copy.deepcopy(policy).cpu()
        for rank in range(self.count):
            p = ctx.Process(target=worker_main, args=(rank, worker_model, run.tokenizer, run.examples, settings, self.shared,
                                                      self.jobs, self.results, self.alive), daemon=True, name=f"rollout-worker-{rank}")
            p.start()
            self.processes.append(p)

    def send(self, job: Job) -> None:
        self.jobs.put(job)

    def receive(self, timeout: float) -> tuple | None:
        try:
            return self.results.get(timeout=timeout) if timeout > 0 else self.results.get_nowait()
        except queue.Empty:
            return None

    def check(self, on_message: Callable[[tuple], None]) -> None:
        """A dead worker ends the run with one line."""
        dead = next(((rank, p) for rank, p in enumerate(self.processes) if not p.is_alive()), None)
        if dead is not None:
            # a failing worker sends its error, then exits: that line says more than its exit code, and the other
            # workers' groups may be queued ahead of it
            deadline = time.monotonic() + 2.0  # bounded: a live worker keeps sending
            while time.monotonic() < deadline and (message := self.receive(0.1)) is not None:
                on_message(message)
            raise UserError(f"rl.mode async: rollout worker {dead[0]} died (exit code {dead[1].exitcode})")

    def last_beat(self) -> float:
        return max(self.alive[:])

    def publish(self, state: dict[str, torch.Tensor], version: int) -> None:
        self.shared.publish(state, version)

    def newest(self) -> int:
        return self.shared.newest()

    def slot(self, version: int) -> dict[str, torch.Tensor]:
        return self.shared.slot(version)

    def finish(self, history: list[dict[str, float]]) -> None:
        pass

    def stop(self) -> None:
        if self.processes:
            self.shared.stopping.set()
        for _ in self.processes:
            self.jobs.put(None)
        deadline = time.monotonic() + 2.0  # a worker killed mid-write can leave a queue lock held: the others may not exit
        for p in self.processes:
            p.join(timeout=max(deadline - time.monotonic(), 0.01))
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        self.processes = []


class AsyncRollouts:
    """The trainer's side of the workers: jobs handed out, completed groups, the pool, and their checkpointed state."""

    def __init__(self, run: RLRun, stream: PromptStream, transport):
        self.run, self.cfg, self.stream, self.transport = run, run.cfg, stream, transport
        self.workers_cfg = run.cfg.workers
        self.policy = pool_policies.get(run.cfg.pool_policy)(run.cfg.options_for(run.cfg.pool_policy))
        self.pool = TrajectoryPool()
        self.payloads: dict[int, dict[str, Any]] = {}  # job number -> the group's tokens, log-probs, versions
        self.pending: dict[int, Job] = {}  # handed out, not pooled yet
        self.received: dict[int, dict[str, Any]] = {}  # completed, not pooled yet (deterministic: not due yet)
        self.next_number = 0
        self.previous: dict[str, torch.Tensor] | None = None  # restored weights of version v - 1 (deterministic)
        self._index = {id(e): i for i, e in enumerate(run.examples)}
        self.generated = self.rejected = 0
        self.waiting_since = time.time()

    # -- checkpointed state ------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        version = self.transport.newest()
        return {
            "pool": [{"prompt": g.prompt, "token_versions": [list(v) for v in g.token_versions], "v_end": list(g.v_end)} for g in self.pool.groups],
            "payloads": {str(g.prompt): self.payloads[g.prompt] for g in self.pool.groups},
            "pending": [asdict(job) for job in self.pending.values()],
            "next_number": self.next_number,
            "previous": self.transport.slot(version - 1) if version >= 1 else {},
            "counts": [self.generated, self.rejected],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pool.groups = [Group(g["prompt"], tuple(map(tuple, g["token_versions"])), tuple(g["v_end"])) for g in state["pool"]]
        self.payloads = {int(k): v for k, v in state["payloads"].items()}
        self.pending = {j["number"]: Job(**j) for j in state["pending"]}
        self.next_number = state["next_number"]
        self.previous = state["previous"] or None
        self.generated, self.rejected = state["counts"]

    # -- workers ----------------------------------------------------------------------------------------------

    def start(self, version: int) -> None:
        """Start the workers with the policy published as `version` (and v - 1 from a checkpoint), and hand out jobs."""
        policy = self.run.policy
        published = ([(version - 1, self.previous)] if self.previous is not None else []) + [(version, policy.state_dict())]
        self.transport.start(self.run, worker_settings(self.run, self.transport.count, next(policy.parameters()).device), published)
        for job in sorted(self.pending.values(), key=lambda j: j.number):  # in flight at the checkpoint: decoded again
            self.transport.send(job)
        if version == 0 and not self.pending:
            self.hand_out(0)

    def stop(self) -> None:
        self.transport.stop()

    def hand_out(self, version: int) -> None:
        """After `version` is published: deterministic, block version + 2 (block 1 and 2 at the start); free-running,
        enough jobs that `queued_groups` are outstanding."""
        w = self.workers_cfg
        if w.deterministic:
            blocks = (1, 2) if version == 0 else (version + 2,)
            for block in blocks:
                self._issue(w.queued_groups, max(0, block - 2), max(0, block - 1))
        else:
            self._issue(w.queued_groups - len(self.pending), NEWEST, NEWEST)

    def _issue(self, n: int, start: int, refresh: int) -> None:
        for example in self.stream.take(max(n, 0)):
            job = Job(self.next_number, self._index[id(example)], start, refresh)
            self.next_number += 1
            self.pending[job.number] = job
            self.transport.send(job)

    def _receive(self, block: bool) -> bool:
        """Take one message from the workers (waiting at most a second when `block`); False when there was none.
        A dead, failing or silent worker ends the run with one line."""
        message = self.transport.receive(1.0 if block else 0.0)
        if message is not None:
            self._message(message)
        self.transport.check(self._message)  # on every call: the other workers' groups may keep the queue busy
        if message is None:
            silent = time.time() - max(self.transport.last_beat(), self.waiting_since)
            if block and silent > self.workers_cfg.timeout_s:
                raise UserError(f"rl.mode async: no {self.transport.noun} progressed for {silent:.0f}s "
                                f"(rl.workers.timeout_s {self.workers_cfg.timeout_s:g}): a worker or weight sync stalled") from None
            return False
        return True

    def _message(self, message: tuple) -> None:
        kind, rank, *rest = message
        if kind == "error":
            raise UserError(f"rl.mode async: {self.transport.noun} {rank} failed: {rest[0]}")
        number, payload = rest
        self.waiting_since = time.time()
        if number in self.pending:  # a job re-issued on resume may also arrive from before: keep one
            self.received[number] = payload

    def _pool(self, number: int) -> None:
        payload = self.received.pop(number)
        payload["example"] = self.pending.pop(number).example
        lengths = [sum(row) for row in payload["mask"]]
        versions = tuple(tuple(payload["versions"][:n]) for n in lengths)
        self.pool.add(Group(number, versions, tuple(v[-1] for v in versions)))
        self.payloads[number] = payload
        self.generated += 1

    def _forget(self, rejected: list[Group]) -> None:
        for g in rejected:
            self.payloads.pop(g.prompt)
        self.rejected += len(rejected)

    def draw(self, step: int) -> tuple[list[Group], dict[str, float]]:
        """The groups update `step` trains on (at v_now = step - 1) and the draw's figures, waiting as the mode says."""
        w, v_now, need = self.workers_cfg, step - 1, self.cfg.prompts_per_step
        start = self.waiting_since = time.time()
        if w.deterministic:
            for number in range((step - 1) * w.queued_groups, step * w.queued_groups):  # block `step`, in prompt order
                while number not in self.received:
                    self._receive(block=True)
                self._pool(number)
            drawn = self.pool.draw(self.policy, v_now, need)
            self._forget(drawn.rejected)
            if drawn.batch is None:
                raise UserError(f"rl.pool_policy {self.cfg.pool_policy} left fewer than rl.prompts_per_step groups in deterministic mode: "
                                "raise rl.workers.queued_groups or loosen the policy")
        else:
            while True:
                while self._receive(block=False):
                    pass
                for number in sorted(self.received):
                    self._pool(number)
                drawn = self.pool.draw(self.policy, v_now, need)
                self._forget(drawn.rejected)
                self.hand_out(v_now)  # pooled or rejected groups leave room for new jobs
                if drawn.batch is not None:
                    break
                self._receive(block=True)
        figures = {**drawn.figures, "async/wait_s": time.time() - start, "async/pending_jobs": float(len(self.pending)),
                   "async/groups_generated": float(self.generated), "async/groups_rejected_total": float(self.rejected)}
        return drawn.batch, figures

    def samples_of(self, groups: list[Group]) -> tuple[Samples, torch.Tensor, list[int]]:
        """The drawn groups' samples (prompt-major rows), each token's version [B, T] (-1 off the produced tokens)
        and each group's example index."""
        device = next(self.run.policy.parameters()).device
        parts, tags, examples = [], [], []
        for g in groups:
            p = self.payloads.pop(g.prompt)
            mask = torch.tensor(p["mask"])
            parts.append(Samples(torch.tensor(p["ids"]), mask, torch.tensor(p["logp"], dtype=torch.float32), torch.tensor(p["finished"])))
            tags.append(torch.tensor(p["versions"])[None, :].expand_as(mask).masked_fill(mask == 0, -1))
            examples.append(p["example"])
        samples = parts[0] if len(parts) == 1 else concat_samples(parts, self.run.pad_id)
        width = samples.completion_ids.shape[1]
        tags = torch.cat([torch.nn.functional.pad(t, (0, width - t.shape[1]), value=-1) for t in tags])
        moved = Samples(*(t.to(device) for t in (samples.completion_ids, samples.completion_mask, samples.logp, samples.finished)))
        return moved, tags, examples


def check_async(cfg: RLConfig, task_class: type) -> None:
    """What asynchronous RL does not support, refused with one line: at config validation (resolve.check, so
    `posttrain preflight` and every stage's CLI fail before any work) and again when training starts."""
    if cfg.mode != "async":
        return
    if hasattr(task_class, "sampler"):
        raise UserError(f"rl.mode async: task {task_class.__name__} samples multi-turn episodes; use rl.mode sync")
    if cfg.dynamic_sampling:
        raise UserError("rl.mode async: rl.dynamic_sampling is not supported (the pool policy decides what is trained)")
    if cfg.sampler != "temperature":
        raise UserError(f"rl.mode async: rl.sampler {cfg.sampler} is not supported (the workers sample at rl.temperature); use rl.mode sync")
    if cfg.workers.queued_groups < cfg.prompts_per_step:
        raise UserError(f"rl.workers.queued_groups ({cfg.workers.queued_groups}) must be at least rl.prompts_per_step ({cfg.prompts_per_step})")


def train_async(run: RLRun, resume: bool, on_log: Callable[[int, dict[str, float]], None],
                on_step: Callable[[int, StepResult], None] | None = None) -> tuple[list[dict[str, float]], list[dict[str, object]]]:
    """`train_online_rl` for `rl.mode: async`: the same steps, on groups drawn from the workers' pool. Under torchrun
    rank 0 is the trainer and the other ranks serve rollouts (trainers/async_dist.py)."""
    cfg, policy = run.cfg, run.policy
    check_async(cfg, type(run.task))
    ctx = distributed.current()
    if ctx.active and not ctx.is_main:
        from posttrain.trainers.async_dist import serve_rollouts

        return serve_rollouts(run)
    loop = TrainLoop(run.checkpoint_dir, run.config_hash, cfg.checkpoint_every, resume, run.max_nonfinite_steps, run.keep_checkpoints,
                     run.checkpoint_section)
    trainer = OnlineRL(run, loop=loop, replicas=distributed.SINGLE)  # the trainer alone takes each update
    stream = PromptStream(run.examples, run.seed)
    if ctx.active:
        from posttrain.trainers.async_dist import RolloutRanks, trainer_signals

        transport, signals = RolloutRanks(cfg.workers.deterministic, cfg.workers.timeout_s), trainer_signals()
    else:
        transport, signals = LocalWorkers(cfg.workers.count), contextlib.nullcontext()
    rollouts = AsyncRollouts(run, stream, transport)
    parts = {"trainer": trainer, "stream": stream, "async": rollouts}
    start_step, saved = loop.restore(policy, parts)
    history: list[dict[str, float]] = saved.get("history", [])
    policy.train()
    bar = progress(cfg.steps, f"rl async ({cfg.advantage}+{cfg.loss}, {cfg.pool_policy})", initial=start_step)
    result = None
    with signals:
        rollouts.start(start_step)
        try:
            for step in range(start_step + 1, cfg.steps + 1):
                groups, figures = rollouts.draw(step)
                samples, tags, examples = rollouts.samples_of(groups)
                prompts = [run.examples[i] for i in examples]
                ids, mask = encode_prompts(run.tokenizer, prompts, trainer.device)
                batch, texts = trainer.score(prompts, ids, mask, samples, StopStrings(run.tokenizer, cfg.stop))
                lag = (step - 1) - tags[samples.completion_mask.cpu().bool()]  # versions each trained token lags v_now
                expanded = [e for e in prompts for _ in range(cfg.group_size)]
                accuracy = train_accuracy(run.task, batch, expanded, texts, samples.finished.tolist(), run.cfg.verify_rollouts)
                if accuracy is not None:
                    figures["accuracy"] = accuracy
                figures.update({"completion_length": float(samples.completion_mask.sum()) / batch.size,
                                "async/token_lag_max": float(lag.max()), "async/token_lag_mean": float(lag.double().mean())})
                result = trainer.step([], collected=(batch, texts, prompts, figures))
                transport.publish(policy.state_dict(), step)
                rollouts.hand_out(step)
                metrics = result.metrics
                history.append(metrics)
                if on_step is not None:
                    on_step(step, result)
                bar.update()
                if step % cfg.log_every == 0 or step == cfg.steps:
                    on_log(step, metrics)
                loop.checkpoint(step, cfg.steps, policy, parts, {"history": history})
            transport.finish(history)
        finally:
            rollouts.stop()
            bar.close()
    if result is None:
        return history, []
    table = [{"prompt": result.prompts[i // cfg.group_size].prompt, "completion": text,
              **{n: float(result.batch.rewards[i, k]) for k, n in enumerate(result.batch.reward_names)}} for i, text in enumerate(result.texts)]
    return history, table
