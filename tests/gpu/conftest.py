"""GPU checks: collected only by `make test-gpu` (POSTTRAIN_GPU_TESTS=1), and they fail, not skip, without CUDA."""

from __future__ import annotations

import os

import pytest
import torch

# cuBLAS needs a fixed workspace for deterministic matmuls (checked by the resume test); set before CUDA starts
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


@pytest.fixture(scope="session", autouse=True)
def cuda_device() -> torch.device:
    # POSTTRAIN_GPU_TESTS_DEVICE=cpu dry-runs the checks' own code on a machine without a GPU
    name = os.environ.get("POSTTRAIN_GPU_TESTS_DEVICE", "cuda")
    assert name != "cuda" or torch.cuda.is_available(), "tests/gpu need a CUDA device: run them on a GPU machine (make test-gpu)"
    return torch.device(name)
