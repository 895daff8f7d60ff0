"""Data-parallel training across processes (torchrun: one process per GPU, on one node or many).

`init()` joins the process group torchrun describes in the environment (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR/PORT): NCCL when CUDA is available, Gloo on CPU. Without those variables it is a no-op and the
trainers run exactly as a single process. Every rank holds a full replica: it takes its share of each batch
(`shard`), back-propagates, and the gradients are summed or averaged over ranks before the (identical)
optimizer step, so replicas never drift (`check_in_sync` asserts it). Only rank 0 writes outputs and logs to
MLflow (stages.execute).

`rl.mode: async` under torchrun uses the ranks differently: rank 0 trains alone and the others are rollout ranks
(trainers/async_dist.py). It reads the rendezvous store that `init` keeps (`store()`) for its small messages.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch

T = TypeVar("T")


@dataclass(frozen=True)
class Context:
    rank: int
    world_size: int
    local_rank: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world_size > 1


SINGLE = Context(rank=0, world_size=1, local_rank=0)  # one process; also the async trainer's own data-parallel world
_current = SINGLE
_store = None  # the rendezvous store of torchrun's process group (None without torchrun)


def init() -> Context:
    """Join torchrun's process group once per process (idempotent); the single-process context without torchrun."""
    global _current, _store
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1 or _current.active:
        return _current
    import torch.distributed as dist

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)  # before NCCL starts: one GPU per process
    if not dist.is_initialized():  # the env:// rendezvous init_process_group would do, keeping its store
        from torch.distributed.constants import default_pg_timeout

        _store, rank, world = next(dist.rendezvous("env://", timeout=default_pg_timeout))
        _store.set_timeout(default_pg_timeout)
        dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo", store=_store, rank=rank, world_size=world)
    _current = Context(rank=dist.get_rank(), world_size=dist.get_world_size(), local_rank=local_rank)
    return _current


def current() -> Context:
    return _current


def store():
    """torchrun's rendezvous store (a TCPStore every rank reaches), or None when `init` did not create the group."""
    return _store


def shard(items: Sequence[T] | torch.Tensor, ctx: Context | None = None):
    """This rank's share of a batch every rank drew identically: items rank, rank + world, ... (strided, so that
    shares differ in size by at most one)."""
    ctx = ctx or _current
    return items[ctx.rank :: ctx.world_size]


def all_sum(value: torch.Tensor, ctx: Context | None = None) -> torch.Tensor:
    """The sum of `value` over ranks (a copy; `value` itself unchanged)."""
    ctx = ctx or _current
    total = value.detach().clone()
    if ctx.active:
        import torch.distributed as dist

        dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total


def reduce_gradients(model: torch.nn.Module, average: bool, ctx: Context | None = None) -> None:
    """Sum (losses already divided by a global count) or average (per-rank mean losses) the gradients over ranks.
    One flat buffer: one collective per step instead of one per tensor."""
    ctx = ctx or _current
    if not ctx.active:
        return
    import torch.distributed as dist

    for p in model.parameters():  # a parameter unused on this rank still takes part, with a zero gradient
        if p.requires_grad and p.grad is None:
            p.grad = torch.zeros_like(p)
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    if average:
        flat /= ctx.world_size
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def check_in_sync(model: torch.nn.Module, ctx: Context | None = None) -> None:
    """Every rank's replica is the same (a cheap checksum): a broken reduction would silently train N models."""
    ctx = ctx or _current
    if not ctx.active:
        return
    import torch.distributed as dist

    checksum = torch.stack([p.detach().double().sum() for p in model.parameters()]).sum().reshape(1)
    gathered = [torch.zeros_like(checksum) for _ in range(ctx.world_size)]
    dist.all_gather(gathered, checksum)
    if any(not torch.equal(g, gathered[0]) for g in gathered):
        raise RuntimeError(f"data-parallel replicas diverged: parameter checksums {[float(g) for g in gathered]}")
