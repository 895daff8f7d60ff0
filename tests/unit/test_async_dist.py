"""The torch.distributed transport of `rl.mode: async` (trainers/async_dist.py) in one process: the store queues
and the weight buffer layout; and the async settings refused at config validation, so `posttrain preflight` fails
before any stage begins. The multi-process run itself: tests/smoke/test_async_torchrun.py."""

from __future__ import annotations

import queue

import pytest
import torch
import torch.distributed as dist

from helpers import micro_params, posttrain_main
from posttrain import resolve
from posttrain.errors import UserError
from posttrain.trainers.async_dist import Layout, StoreQueue


def test_a_store_queue_is_a_fifo_whose_reader_keeps_what_it_puts_back():
    store = dist.PrefixStore("t", dist.HashStore())
    writer, reader = StoreQueue(store, "jobs/1"), StoreQueue(store, "jobs/1")
    with pytest.raises(queue.Empty):
        reader.get_nowait()
    idle = []
    reader.idle = lambda: idle.append(1)
    with pytest.raises(queue.Empty):
        reader.get(timeout=0.02)
    assert idle  # a waiting reader keeps its rank's other duties going (weights, heartbeat)
    for item in ({"a": [1, 2]}, None, 3):
        writer.put(item)
    assert reader.get(timeout=1.0) == {"a": [1, 2]} and reader.get_nowait() is None
    reader.put(None)  # the stop signal handed back while batching: the reader's own next item
    assert reader.get_nowait() is None and reader.get_nowait() == 3
    assert not store.check(["jobs/1/0", "jobs/1/1", "jobs/1/2"])  # read items leave the store
    with pytest.raises(queue.Empty):
        reader.get_nowait()


def test_the_weight_buffer_round_trips_every_dtype_and_carries_its_version():
    class Mixed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Parameter(torch.randn(3, dtype=torch.bfloat16))  # 6 bytes: the next entry needs padding
            self.b = torch.nn.Parameter(torch.randn(2, 5))
            self.register_buffer("mask", torch.tensor([True, False, True]))
            self.register_buffer("count", torch.tensor([7], dtype=torch.int64))

    source, target = Mixed(), Mixed()
    layout = Layout(source)
    assert [offset % 8 for *_, offset, _ in layout.entries] == [0, 0, 0, 0]
    buffer = layout.pack(source.state_dict(), 5, torch.device("cpu"))
    assert buffer.dtype == torch.uint8 and buffer.numel() == layout.nbytes and layout.version(buffer) == 5
    assert any(not torch.equal(source.state_dict()[k], v) for k, v in target.state_dict().items())
    layout.load(target, buffer)
    assert all(torch.equal(source.state_dict()[k], v) for k, v in target.state_dict().items())


def test_unsupported_async_settings_fail_at_config_validation_and_preflight(tmp_path, monkeypatch, capsys):
    params = micro_params(tmp_path)
    async_ok = ["rl.mode=async", "rl.workers.queued_groups=4", "rl.prompts_per_step=4"]
    resolve.load(params, async_ok)
    cases = {
        "rl.dynamic_sampling=true": "rl.mode async: rl.dynamic_sampling is not supported",
        "rl.workers.queued_groups=2": r"rl.workers.queued_groups \(2\) must be at least rl.prompts_per_step \(4\)",
        "task.name=text_world": "rl.mode async: task TextWorld samples multi-turn episodes; use rl.mode sync",
    }
    for override, line in cases.items():
        with pytest.raises(UserError, match=f"^{line}"):
            resolve.load(params, [*async_ok, override])
    resolve.load(params, ["rl.dynamic_sampling=true", "rl.workers.queued_groups=2"])  # rl.mode sync: none of it applies
    monkeypatch.chdir(tmp_path)
    code, out, err = posttrain_main(monkeypatch, capsys, "preflight", *[f"--set={o}" for o in async_ok], "--set=rl.dynamic_sampling=true")
    assert code == 2 and not out and err.strip() == "posttrain: error: rl.mode async: rl.dynamic_sampling is not supported (the pool policy decides what is trained)"
