"""The rollout loop that `rl.mode: async` shares between its two transports: the local worker processes
(trainers/async_rl.py) and the rollout ranks under torchrun (trainers/async_dist.py). Both import it from here, so
neither imports the other's module at load time.

A `Job` is one prompt handed to a worker with the policy versions it decodes under; `decode_jobs` decodes jobs' groups,
loading weights between decode steps, until the stop signal; `worker_settings` is what it reads from the run.
"""

from __future__ import annotations

import queue
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from posttrain.rollout.sampling import StopStrings, encode_prompts, sample

if TYPE_CHECKING:
    from posttrain.trainers.online_rl import RLRun

NEWEST = -1  # a job's version when the worker takes whatever the trainer published last


@dataclass(frozen=True)
class Job:
    number: int  # the n-th prompt handed out in this run (0-based)
    example: int  # its index in the run's training examples
    start: int  # the version its first tokens decode under (NEWEST: free-running)
    refresh: int  # the version from decode step `refresh_every_tokens` on (NEWEST: free-running)


class Stopped(Exception):
    """The trainer is stopping the workers."""


def job_generator(seed: int, number: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + number)


def worker_settings(run: RLRun, count: int, device: torch.device) -> dict[str, Any]:
    """What the decode loop reads, for `count` workers (or rollout ranks) decoding on `device`."""
    cfg, w = run.cfg, run.cfg.workers
    return {"stop": tuple(cfg.stop), "timeout": w.timeout_s, "refresh_every_tokens": w.refresh_every_tokens, "group_size": cfg.group_size,
            "max_new_tokens": cfg.max_new_tokens, "temperature": cfg.temperature, "seed": run.seed,
            "jobs_per_worker": -(-w.queued_groups // count), "device": str(device)}


def decode_jobs(rank: int, model, tokenizer, examples, settings: dict, weights, jobs, results, beat: Callable[[], None],
                stopping: Callable[[], bool]) -> None:
    """The rollout loop of a worker process and of a rollout rank (trainers/async_dist.py): decode each job's group,
    loading weights between decode steps, and send it back. `weights` has `newest()` and `load(model, version,
    timeout, beat)`; `jobs` and `results` are queues (`get(timeout)`, `get_nowait()`, `put`); None is the stop signal."""
    torch.set_num_threads(1)
    model.to(settings["device"]).eval().requires_grad_(False)
    stop = StopStrings(tokenizer, settings["stop"])
    held = [-2]  # the version in the model

    def hold(version: int) -> None:
        if version == NEWEST and weights.newest() == held[0]:
            return
        if version != held[0]:
            held[0] = weights.load(model, version, settings["timeout"], beat)

    while True:
        try:
            job = jobs.get(timeout=1.0)
        except queue.Empty:
            # the trainer was killed (kill -9 leaves no one to stop us), or is stopping while a killed worker
            # still holds the queue's lock (get() times out instead of seeing the stop signal)
            if stopping():
                return
            continue
        if job is None:
            return
        batch = [job]  # free-running, a worker decodes the jobs waiting in the queue together (one forward per step)
        while job.start == NEWEST and len(batch) < settings["jobs_per_worker"]:
            try:
                more = jobs.get_nowait()
            except queue.Empty:
                break
            if more is None:
                jobs.put(None)  # the stop signal is another worker's too, or ours after this batch
                break
            batch.append(more)
        beat()
        hold(job.start)
        versions = [held[0]]

        def between(t: int) -> None:  # before the forward that gives token t; called within this job only
            if job.refresh == NEWEST or t == settings["refresh_every_tokens"]:  # noqa: B023
                hold(job.refresh)  # noqa: B023
            versions.append(held[0])  # noqa: B023
            beat()

        # deterministic: one job, its own generator, so a group does not depend on its worker or its neighbours
        ids, mask = encode_prompts(tokenizer, [examples[j.example] for j in batch], settings["device"])
        samples = sample(model, ids, mask, group_size=settings["group_size"], max_new_tokens=settings["max_new_tokens"],
                         eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id, temperature=settings["temperature"],
                         generator=job_generator(settings["seed"], job.number), stop=stop or None, between_steps=between)
        g = settings["group_size"]
        for i, done in enumerate(batch):
            rows = slice(i * g, (i + 1) * g)
            results.put(("done", rank, done.number, {
                "ids": samples.completion_ids[rows].tolist(), "mask": samples.completion_mask[rows].tolist(),
                "logp": samples.logp[rows].tolist(), "finished": samples.finished[rows].tolist(), "versions": versions,
            }))

