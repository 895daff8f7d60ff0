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
