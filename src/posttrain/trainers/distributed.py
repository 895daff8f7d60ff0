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
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
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


def all_gather_object(value: T, ctx: Context | None = None) -> list[T]:
    """`value` of every rank, in rank order (a collective under torchrun; `[value]` without it)."""
    ctx = ctx or _current
    if not ctx.active:
        return [value]
    import torch.distributed as dist

    gathered: list = [None] * ctx.world_size
    dist.all_gather_object(gathered, value)
    return gathered


def reduce_gradients(model: torch.nn.Module, average: bool, ctx: Context | None = None) -> None:
    """Sum (losses already divided by a global count) or average (per-rank mean losses) the gradients over ranks.
    One flat buffer: one collective per step instead of one per tensor. A no-op for an FSDP-sharded model, whose
    gradients FSDP reduce-scatters itself (`shard_model`)."""
    ctx = ctx or _current
    if not ctx.active or is_sharded(model):
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
    """Every rank's replica is the same (a cheap checksum): a broken reduction would silently train N models. A
    sharded model is one model, not replicas: nothing to compare."""
    ctx = ctx or _current
    if not ctx.active or is_sharded(model):
        return
    import torch.distributed as dist

    checksum = torch.stack([p.detach().double().sum() for p in model.parameters()]).sum().reshape(1)
    gathered = [torch.zeros_like(checksum) for _ in range(ctx.world_size)]
    dist.all_gather(gathered, checksum)
    if any(not torch.equal(g, gathered[0]) for g in gathered):
        raise RuntimeError(f"data-parallel replicas diverged: parameter checksums {[float(g) for g in gathered]}")


# -- FSDP2 (training.sharding: fsdp) ------------------------------------------------------------------------------
# Each rank keeps 1/world of every parameter (a DTensor sharded on dim 0); a decoder layer's full weights are
# all-gathered just before its forward and backward and freed after, and gradients are reduce-scattered. SFT SUMS the
# gradients over ranks (divide factor 1), like `reduce_gradients(average=False)`: its loss is already divided by the
# global token count. RL AVERAGES them (divide factor world), like `reduce_gradients(average=True)`: each rank's loss
# is the mean over its own share of the prompts. Either way the sharded update equals the replicated one up to the
# order of floating-point sums.


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks of a causal LM (`model.model.layers` for Llama/Qwen2-shaped models), the FSDP units."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    return list(layers) if layers is not None else []


def shard_model(model: torch.nn.Module, ctx: Context | None = None, average: bool = False, frozen: bool = False) -> torch.nn.Module:
    """`fully_shard` each decoder layer, then the root (embeddings, final norm, head), over all ranks. A no-op
    without torchrun. Activation checkpointing (`model.gradient_checkpointing`, set before) keeps working: the
    recomputed forward of a layer unshards it again. `average`: gradients averaged over ranks instead of summed.
    `frozen` (a model that only runs forwards, RL's reference): the root reshards after its forward too (a trained
    root stays gathered until its backward, which a frozen model never runs)."""
    ctx = ctx or _current
    if not ctx.active:
        return model
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    device = next(model.parameters()).device
    mesh = init_device_mesh(device.type, (ctx.world_size,))
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh, reshard_after_forward=True if frozen else None)
    for unit in model.modules():
        if isinstance(unit, FSDPModule):
            unit.set_gradient_divide_factor(float(ctx.world_size) if average else 1.0)
            unit.set_force_sum_reduction_for_comms(True)  # a plain SUM collective (then the division): Gloo has no PREMUL_SUM
    return model


@contextmanager
def gathered(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """The whole weights of a sharded model on every rank for the duration: `FSDPModule.unshard()` on every unit, then
    `reshard()` after. The rollout engine's decoders (models/decoders.py) call a layer's submodules directly, around the
    forward hooks through which FSDP gathers that layer, so a rollout runs on gathered weights (as verl's rollout does:
    the rank holds the whole policy while it generates, its shards again for the update). A forward through the model's
    own hooks inside keeps them gathered (the units do not reshard after forward until the end). A no-op for a model
    that is not sharded."""
    from torch.distributed.fsdp import FSDPModule

    if not is_sharded(model):
        yield model
        return
    units = [unit for unit in model.modules() if isinstance(unit, FSDPModule)]
    layers = [unit for unit in units if unit is not model]  # they reshard after forward (shard_model); the root does not
    for unit in units:
        unit.unshard()
    for unit in layers:
        unit.set_reshard_after_forward(False, recurse=False)
    try:
        yield model
    finally:
        for unit in layers:
            unit.set_reshard_after_forward(True, recurse=False)
        for unit in units:
            unit.reshard()


def is_sharded(model: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's weights as plain CPU tensors (a collective under FSDP: every rank must call it; each gets them)."""
    if not is_sharded(model):
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=False))


def load_full_state_dict(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """Put whole-model weights (every rank holds them) into a sharded model: each rank keeps its shards."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(model, weights, options=StateDictOptions(full_state_dict=True))


def full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer state of a sharded model, gathered whole and keyed by parameter name (a collective)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True))


def load_full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))


def local_numel(model: torch.nn.Module) -> int:
    """Parameter elements this rank holds (its shards under FSDP; everything for a replica)."""
    from torch.distributed.tensor import DTensor

    return sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in model.parameters())


def shard_sizes(model: torch.nn.Module, ctx: Context | None = None) -> dict[str, float]:
    """`local_parameters` (this rank's) and `largest_local_parameters` (the largest rank's), a collective under torchrun."""
    ctx = ctx or _current
    local = torch.tensor(float(local_numel(model)))
    largest = local.clone()
    if ctx.active:
        import torch.distributed as dist

        dist.all_reduce(largest, op=dist.ReduceOp.MAX)
    return {"local_parameters": float(local), "largest_local_parameters": float(largest)}
