"""Shared fixtures for the unit tests: the repo's params.yaml, a loaded config, a char tokenizer."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # unit tests never touch the network

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def params_path() -> Path:
    return REPO / "params.yaml"


@pytest.fixture(scope="session")
def cfg(params_path):
    from posttrain.resolve import load

    return load(params_path)


@pytest.fixture(scope="session")
def char_tokenizer():
    from posttrain.models import train_char_tokenizer

    return train_char_tokenizer(["0123456789-=+*"])


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def sharp_model(request, cfg, char_tokenizer):
    """A tiny Qwen2 or Llama with weights large enough that logits differ clearly across tokens and positions (the
    default 0.02 init makes every distribution near-uniform, and greedy choices near ties), and non-zero q/k/v
    biases on Qwen2."""
    import torch

    from posttrain.models import build_tiny

    model_cfg = cfg.model.model_copy(update={"arch": request.param, "hidden_size": 32, "intermediate_size": 48, "heads": 4, "kv_heads": 2})
    torch.manual_seed(0)
    model = build_tiny(model_cfg, char_tokenizer)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.2 * torch.randn_like(p) if name.endswith("norm.weight") else 0.3 * torch.randn_like(p))
    return model.eval()
