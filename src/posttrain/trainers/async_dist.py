"""`rl.mode: async` under torchrun: rank 0 trains, every other rank is a rollout rank (docs/async.md says why).

The roles are those of trainers/async_rl.py, and the rollout loop is the same (`decode_jobs`, trainers/async_decode.py); only the transport differs:

- weights: after each update the trainer broadcasts the policy (`dist.broadcast`, gloo on CPU, nccl on GPU) to a
  process group of all ranks. The state dict travels as one byte buffer (`Layout`) with its version in its last 8
  bytes. A rollout rank keeps one receive posted (`async_op=True`), so the bytes land while it decodes; between
  decode steps it collects what has arrived (`ReceivedWeights.poll`) and keeps the two newest versions, as the
  local workers' two shared slots do. The trainer keeps at most two broadcasts in flight: once it has sent
  version v it waits, at most `rl.workers.timeout_s`, for v - 2 to reach every rank.
- jobs out and groups back: small pickled messages in torchrun's rendezvous store (TCPStore), one FIFO per rank
  and direction (`StoreQueue`: one writer, one reader, a counter and a key per item). The trainer assigns a job
  to the rank with the fewest outstanding jobs (deterministic: rank 1 + number % rollout ranks).
- liveness: a rollout rank bumps a heartbeat counter in the store; the trainer ends the run with one line when no
  rank progressed for `rl.workers.timeout_s` (the local workers' rule). A rank that dies is torchrun's to see: it
  stops every rank; the trainer turns that SIGTERM into one line. A rollout rank whose job fails sends its error
  to the trainer, which ends the run with it.

At the end the trainer writes its history to the store and a rollout rank loads the last version, so every rank
leaves `train_online_rl` with the trained weights and the history, as data-parallel replicas do.
"""

from __future__ import annotations

import copy
import os
import pickle
import queue
import signal
import time
import traceback
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

from posttrain.errors import UserError
from posttrain.signals import signal_raises
from posttrain.trainers import distributed
from posttrain.trainers.async_decode import NEWEST, Stopped, decode_jobs, worker_settings

POLL_S = 0.002  # between two looks at the store or a pending broadcast
BEAT_S = 0.2  # a rollout rank's heartbeat period


def async_store():
    """This launch's keys in torchrun's store (a restart of the workers by torchrun starts on fresh keys)."""
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"posttrain/async/{attempt}", distributed.store())


def weights_group():
    """A process group of every rank for the weight broadcasts (a collective: every rank calls it once)."""
    return dist.new_group(backend="nccl" if torch.cuda.is_available() else "gloo")


class StoreQueue:
    """A FIFO in a torch.distributed Store with one writer and one reader: item i under `<name>/<i>`, the count under
    `<name>/n` (set after the item, so a counted item is there). A reader's `put` keeps the item for its own next
    `get` (the stop signal a worker hands back, as it would to a shared queue)."""

    def __init__(self, store, name: str, idle: Callable[[], None] | None = None):
        self.store, self.name, self.idle = store, name, idle
        self.written = self.read = 0
        self.returned: list[Any] = []
        self.reader = False

    def put(self, item: Any) -> None:
        if self.reader:
            self.returned.append(item)
            return
        self.store.set(f"{self.name}/{self.written}", pickle.dumps(item))
        self.written += 1
        self.store.add(f"{self.name}/n", 1)

    def get_nowait(self) -> Any:
        self.reader = True
        if self.returned:
            return self.returned.pop()
        if self.read >= self.store.add(f"{self.name}/n", 0):
            raise queue.Empty
        key = f"{self.name}/{self.read}"
        item = pickle.loads(self.store.get(key))
        self.store.delete_key(key)
        self.read += 1
        return item

    def get(self, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.get_nowait()
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise
            if self.idle is not None:
                self.idle()
            time.sleep(POLL_S)


class Layout:
    """A state dict as one byte buffer (each tensor padded to 8 bytes) followed by its version (int64)."""

    def __init__(self, model: torch.nn.Module):
        self.entries = []
        offset = 0
        for key, tensor in model.state_dict().items():
            n = tensor.numel() * tensor.element_size()
            self.entries.append((key, tensor.dtype, tensor.shape, offset, n))
            offset += -(-n // 8) * 8
        self.nbytes = offset + 8

    def pack(self, state: dict[str, torch.Tensor], version: int, device: torch.device) -> torch.Tensor:
        buffer = torch.zeros(self.nbytes, dtype=torch.uint8, device=device)
        for key, _, _, offset, n in self.entries:
            buffer[offset : offset + n] = state[key].detach().contiguous().reshape(-1).view(torch.uint8).to(device)
        buffer[-8:] = torch.tensor([version], dtype=torch.int64).view(torch.uint8).to(device)
        return buffer

    def version(self, buffer: torch.Tensor) -> int:
        return int(buffer[-8:].cpu().view(torch.int64)[0])

    def unpack(self, buffer: torch.Tensor) -> dict[str, torch.Tensor]:
        return {key: buffer[offset : offset + n].view(dtype).view(shape) for key, dtype, shape, offset, n in self.entries}

    def load(self, model: torch.nn.Module, buffer: torch.Tensor) -> None:
        tensors = self.unpack(buffer)
        with torch.no_grad():
            for key, tensor in model.state_dict().items():
                tensor.copy_(tensors[key])


# --- the trainer's side ------------------------------------------------------------------------------------------

class RolloutRanks:
    """The trainer's transport to the rollout ranks (the interface of async_rl.LocalWorkers)."""

    noun = "rollout rank"

    def __init__(self, deterministic: bool, timeout_s: float):
        ctx = distributed.current()
        self.ranks = list(range(1, ctx.world_size))
        self.count = len(self.ranks)
        self.deterministic, self.timeout_s = deterministic, timeout_s
        self.store = async_store()
        self.group = weights_group()
        self.device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        self.jobs = {r: StoreQueue(self.store, f"jobs/{r}") for r in self.ranks}
        self.results = {r: StoreQueue(self.store, f"results/{r}") for r in self.ranks}
        self.assigned: dict[int, int] = {}  # job number -> rank, until its group is back
        self.beats = {r: (0, time.time()) for r in self.ranks}  # rank -> (heartbeat count, when it last changed)
        self.inflight: list[tuple[int, Any, torch.Tensor]] = []  # (version, work, buffer) of unfinished broadcasts
        self.slots: dict[int, torch.Tensor] = {}  # version -> packed buffer: the newest two published
        self.layout: Layout | None = None

    def start(self, run, settings: dict, published: list[tuple[int, dict[str, torch.Tensor]]]) -> None:
        self.layout = Layout(run.policy)
        for version, state in published:
            self.publish(state, version)

    def send(self, job) -> None:
        if self.deterministic:
            rank = self.ranks[job.number % len(self.ranks)]
        else:
            load = {r: 0 for r in self.ranks}
            for r in self.assigned.values():
                load[r] += 1
            rank = min(self.ranks, key=lambda r: (load[r], r))
        self.assigned[job.number] = rank
        self.jobs[rank].put(job)

    def receive(self, timeout: float) -> tuple | None:
        deadline = time.monotonic() + timeout
        while True:
            for rank in self.ranks:
                try:
                    message = self.results[rank].get_nowait()
                except queue.Empty:
                    continue
                if message[0] == "done":
                    self.assigned.pop(message[2], None)
                return message
            if time.monotonic() >= deadline:
                return None
            time.sleep(POLL_S)

    def check(self, on_message: Callable[[tuple], None]) -> None:
        """A rank that dies is seen by torchrun, which stops every rank (`trainer_signals`)."""

    def last_beat(self) -> float:
        now = time.time()
        for rank in self.ranks:
            count = self.store.add(f"beat/{rank}", 0)
            if count != self.beats[rank][0]:
                self.beats[rank] = (count, now)
        return max(t for _, t in self.beats.values())

    def publish(self, state: dict[str, torch.Tensor], version: int) -> None:
        buffer = self.layout.pack(state, version, self.device)
        self.inflight.append((version, dist.broadcast(buffer, src=0, group=self.group, async_op=True), buffer))
        self.slots[version] = buffer
        for old in [v for v in self.slots if v < version - 1]:
            del self.slots[old]
        self._wait_broadcasts(keep=2)

    def _wait_broadcasts(self, keep: int) -> None:
        while len(self.inflight) > keep:
            version, work, _ = self.inflight[0]
            deadline = time.monotonic() + self.timeout_s
            while not work.is_completed():
                if time.monotonic() > deadline:
                    raise UserError(f"rl.mode async: the weight broadcast of version {version} did not reach every rollout rank "
                                    f"within {self.timeout_s:g}s (rl.workers.timeout_s)")
                time.sleep(POLL_S)
            try:
                work.wait()
            except RuntimeError as e:  # gloo: a rank's connection closed (it died)
                raise UserError(f"rl.mode async: the weight broadcast of version {version} failed: {str(e).splitlines()[0]}") from None
            self.inflight.pop(0)

    def newest(self) -> int:
        return max(self.slots, default=-1)

    def slot(self, version: int) -> dict[str, torch.Tensor]:
        return {k: v.to("cpu", copy=True) for k, v in self.layout.unpack(self.slots[version]).items()}

    def finish(self, history: list[dict[str, float]]) -> None:
        """The run is over: every broadcast delivered, then the history for the rollout ranks' replicas."""
        self._wait_broadcasts(keep=0)
        self.store.set("final", pickle.dumps(history))

    def stop(self) -> None:
        self.store.set("stop", b"1")
        for rank in self.ranks:
            self.jobs[rank].put(None)


@contextmanager
def trainer_signals():
    """While the trainer runs under torchrun, torchrun's SIGTERM (it stops every rank when one ends) is one line."""
    def stopped() -> UserError:
        return UserError("rl.mode async: torchrun stopped the trainer (SIGTERM): another rank of the job ended first "
                         "(a rollout rank died or was killed; torchrun's summary names it)")

    with signal_raises(signal.SIGTERM, stopped):
        yield


# --- a rollout rank -------------------------------------------------------------------------------------------------

class ReceivedWeights:
    """A rollout rank's end of the broadcasts, with `SharedWeights`' interface (`newest`, `load`): one receive always
    posted (until the run's last version), the two newest versions kept."""

    def __init__(self, layout: Layout, group, device: torch.device, last_version: int, stopping: Callable[[], bool]):
        self.layout, self.group, self.device, self.last_version, self.stopping = layout, group, device, last_version, stopping
        self.slots: dict[int, torch.Tensor] = {}
        self.work = None
        self._post()

    def _post(self) -> None:
        self.buffer = torch.empty(self.layout.nbytes, dtype=torch.uint8, device=self.device)
        self.work = dist.broadcast(self.buffer, src=0, group=self.group, async_op=True)

    def poll(self) -> int:
        """Collect what has arrived; the newest version held (-1: none yet)."""
        while self.work is not None and self.work.is_completed():
            self.work.wait()  # a failed broadcast raises here
            version = self.layout.version(self.buffer)
            self.slots[version] = self.buffer
            for old in [v for v in self.slots if v < version - 1]:
                del self.slots[old]
            self.work = None
            if version < self.last_version:
                self._post()
        return self.newest()

    def newest(self) -> int:
        if self.work is not None and self.work.is_completed():
            return self.poll()
        return max(self.slots, default=-1)

    def load(self, model: torch.nn.Module, version: int, timeout: float, beat: Callable[[], None]) -> int:
        """Copy `version` (NEWEST: the newest) into `model`, waiting at most `timeout` s for it to arrive."""
        deadline = time.monotonic() + timeout
        while (newest := self.poll()) < max(version, 0):
            if self.stopping():
                raise Stopped
            if time.monotonic() > deadline:
                raise TimeoutError(f"weight sync: version {version} did not arrive within {timeout:g}s")
            beat()
            time.sleep(POLL_S)
        version = newest if version == NEWEST else version
        if version not in self.slots:
            raise RuntimeError(f"weight sync: version {version} was overwritten (newest is {newest})")
        self.layout.load(model, self.slots[version])
        return version


def serve_rollouts(run) -> tuple[list[dict[str, float]], list[dict[str, object]]]:
    """A rollout rank: the workers' decode loop on this rank's jobs, then the trained weights and the history."""
    ctx, cfg = distributed.current(), run.cfg
    store, group = async_store(), weights_group()
    timeout = cfg.workers.timeout_s
    device = next(run.policy.parameters()).device
    last_stop_check, stopped = [0.0], [False]

    def stopping() -> bool:
        now = time.monotonic()
        if not stopped[0] and now - last_stop_check[0] > BEAT_S:
            last_stop_check[0] = now
            stopped[0] = store.check(["stop"])
        return stopped[0]

    buffer_device = device if torch.cuda.is_available() else torch.device("cpu")
    weights = ReceivedWeights(Layout(run.policy), group, buffer_device, cfg.steps, stopping)
    last_beat = [0.0]

    def beat() -> None:
        weights.poll()
        now = time.monotonic()
        if now - last_beat[0] > BEAT_S:
            last_beat[0] = now
            store.add(f"beat/{ctx.rank}", 1)

    jobs = StoreQueue(store, f"jobs/{ctx.rank}", idle=beat)
    results = StoreQueue(store, f"results/{ctx.rank}")
    settings = worker_settings(run, ctx.world_size - 1, device)
    model = copy.deepcopy(run.policy)  # as the local workers decode: a copy of the policy (fresh, aligned storage)
    try:
        decode_jobs(ctx.rank, model, run.tokenizer, run.examples, settings, weights, jobs, results, beat, stopping)
    except Stopped:
        pass
    except Exception as e:  # the trainer ends the run with this line; if it cannot, this rank does
        line = f"{type(e).__name__}: {e}" if str(e) else traceback.format_exc(limit=1)
        results.put(("error", ctx.rank, line))
        deadline = time.monotonic() + timeout
        while not store.check(["stop"]) and time.monotonic() < deadline:
            time.sleep(BEAT_S)
        if store.check(["stop"]):
            raise SystemExit(1) from None
        raise UserError(f"rl.mode async: rollout rank {ctx.rank} failed and the trainer did not answer within {timeout:g}s: {line}") from None
    if not store.check(["final"]):  # the trainer stopped without finishing: it says why
        raise SystemExit(1)
    history = pickle.loads(store.get("final"))
    weights.load(run.policy, cfg.steps, timeout, lambda: None)
    return history, []
