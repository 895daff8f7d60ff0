"""The preference loop on a tiny model, in process: every registered objective takes steps and learns the pairs;
ABC-Align sees the labelled pairs appended with their human labels and the pool's labels hidden."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from posttrain.data.preferences import PreferencePair
from posttrain.models import build_tiny, train_char_tokenizer
from posttrain.objectives.preference import preference_objectives
from posttrain.trainers.preference import train_preference


@pytest.fixture(scope="module")
def setup():
    tokenizer = train_char_tokenizer(["0123456789+=-"])
    sizes = SimpleNamespace(arch="qwen2", hidden_size=32, layers=1, heads=4, kv_heads=2, intermediate_size=64, max_positions=32, dtype="float32")
    torch.manual_seed(0)
    state = build_tiny(sizes, tokenizer).state_dict()
    pairs = [PreferencePair(f"{a:02d}+{b:02d}=", str(a + b), str(a + b + 1), 1 / 3, (True if i % 2 else False) if i < 6 else None)
             for i, (a, b) in enumerate((i, 2 * i % 50) for i in range(24))]
    return tokenizer, sizes, state, pairs


@pytest.mark.parametrize("objective", preference_objectives.names())
def test_every_objective_learns_the_pairs(setup, cfg, objective):
    tokenizer, sizes, state, pairs = setup
    model = build_tiny(sizes, tokenizer)
    model.load_state_dict(state)
    pref = cfg.preference.model_copy(update={"objective": objective, "steps": 12, "batch_size": 8, "lr": 5e-3, "warmup_steps": 0, "log_every": 4,
                                             "beta": 0.5})
    seen = []
    entry = preference_objectives.entry(objective)
    original = entry.obj

    def spy(p, c, state):
        seen.append(p.gold.clone())
        return original(p, c, state)

    object.__setattr__(entry, "obj", spy)
    try:
        history, metrics = train_preference(model, tokenizer, pairs, pairs[:8], pref, seed=0, on_log=lambda s, m: None)
    finally:
        object.__setattr__(entry, "obj", original)
    assert len(history) == 3 and all(math.isfinite(h["loss"]) for h in history)
    assert metrics["heldout_pair_accuracy_before"] == 0.0 and metrics["heldout_pair_accuracy"] > 0.5
    labelled = [int((~torch.isnan(g)).sum()) for g in seen]
    if entry.meta.get("gold_rows"):  # the 6 labelled pairs ride along in every batch, and only they carry labels
        assert all(n == 6 for n in labelled) and all(g.shape[0] == 8 + 6 for g in seen)
    else:
        assert all(g.shape[0] == 8 for g in seen)
