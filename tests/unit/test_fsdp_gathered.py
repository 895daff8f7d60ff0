"""`distributed.gathered`: the rollout engine's decoders run on an FSDP2-sharded model's gathered weights, a forward
through the model's own hooks inside the scope leaves them gathered, and the shards are back after it. One process
(a Gloo group of one: FSDP2 still swaps its units' parameters between sharded DTensors and plain tensors, so the
decoders' direct submodule calls fail on a resharded unit exactly as they would across ranks)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from helpers import micro_rl_parts
from posttrain.rollout.decode import sample
from posttrain.trainers import distributed


@pytest.fixture
def sharded_and_plain(tmp_path):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    cfg, _, _, tokenizer, _, model = micro_rl_parts(tmp_path, ["model.layers=2"], 4)
    plain = type(model)(model.config)
    plain.load_state_dict(model.state_dict())
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        for layer in distributed.decoder_layers(model):  # as distributed.shard_model does across ranks
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        yield model, plain, tokenizer
    finally:
        dist.destroy_process_group()


def _draw(model, tokenizer, seed: int):
    ids = torch.tensor([[5, 6, 7, 8], [0, 5, 9, 7]])
    mask = torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1]])
    return sample(model, ids, mask, group_size=2, max_new_tokens=5, eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id,
                  generator=torch.Generator().manual_seed(seed))


def test_decoding_on_gathered_weights_equals_the_plain_model_and_the_shards_return(sharded_and_plain):
    model, plain, tokenizer = sharded_and_plain
    assert distributed.is_sharded(model) and all(isinstance(p, DTensor) for p in model.parameters())
    with pytest.raises(RuntimeError, match="DTensor"):  # the decoder goes around the hooks: sharded weights it cannot use
        _draw(model, tokenizer, 0)
    expected = _draw(plain, tokenizer, 0)
    ids = torch.tensor([[5, 6, 7, 8]])
    with distributed.gathered(model):
        assert not any(isinstance(p, DTensor) for p in model.parameters())
        with torch.no_grad():
            logits = model(input_ids=ids).logits  # through the hooks: the layers must stay gathered after it
        got = _draw(model, tokenizer, 0)
    torch.testing.assert_close(logits, plain(input_ids=ids).logits.detach())
    assert torch.equal(got.completion_ids, expected.completion_ids)
    torch.testing.assert_close(got.logp, expected.logp)
    assert all(isinstance(p, DTensor) for p in model.parameters())  # resharded after the scope
    model(input_ids=ids).logits.sum().backward()  # and the hooks train it as before
    assert all(isinstance(p.grad, DTensor) for p in model.parameters())
