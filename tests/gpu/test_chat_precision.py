"""A chat checkpoint on the GPU: bf16 and fp16 autocast train and sample with finite numbers, and activation
checkpointing gives the CPU-tested loss and gradients there too."""

from __future__ import annotations

import copy

import pytest
import torch

from posttrain.models import load_pretrained, prepare_model
from posttrain.models.chat import encode_prompts, encode_supervised
from posttrain.rollout.sampling import generate
from posttrain.resolve import load
from posttrain.tasks import Example

from helpers import REPO

EXAMPLES = [Example("12+34=", "46", "46"), Example("1+2=", "3", "3", system="You add numbers.")]


def sft_loss(model, tokenizer, device):
    ids, mask, labels = (t.to(device) for t in encode_supervised(tokenizer, EXAMPLES))
    return model(input_ids=ids, attention_mask=mask, labels=labels).loss


@pytest.mark.parametrize("mode", ["bf16", "fp16"])
def test_autocast_trains_and_samples(chat_checkpoints, cuda_device, mode):
    if mode == "fp16" and cuda_device.type != "cuda":
        pytest.skip("fp16 autocast needs CUDA")
    model, tokenizer = load_pretrained(chat_checkpoints["qwen2"])
    cfg = load(REPO / "params.yaml", [f"model.autocast={mode}"]).model
    model = prepare_model(model, tokenizer, cfg, cuda_device).train()
    loss = sft_loss(model, tokenizer, cuda_device)
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    samples, texts = generate(model, tokenizer, EXAMPLES, 8, group_size=4)
    assert samples.completion_ids.shape[0] == 8 and torch.isfinite(samples.logp).all()
    ids, mask = encode_prompts(tokenizer, EXAMPLES, cuda_device)
    assert ids.device.type == cuda_device.type


def test_checkpointing_matches_on_the_device(chat_checkpoints, cuda_device):
    model, tokenizer = load_pretrained(chat_checkpoints["llama"])
    params = load(REPO / "params.yaml")
    results = []
    for checkpointing in (False, True):
        cfg = params.model.model_copy(update={"gradient_checkpointing": checkpointing})
        copy_ = prepare_model(copy.deepcopy(model), tokenizer, cfg, cuda_device).train()
        loss = sft_loss(copy_, tokenizer, cuda_device)
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in copy_.parameters()]))
    (loss, grads), (loss_c, grads_c) = results
    torch.testing.assert_close(loss_c, loss)
    for g, g_c in zip(grads, grads_c):
        torch.testing.assert_close(g_c, g, rtol=1e-4, atol=1e-6)
