"""The off-policy corrections and the mismatch figures through `OnlineRL` on a micro model (synchronous steps)."""

from __future__ import annotations

import pytest
import torch

from helpers import REPO, micro_rl_parts
from posttrain import resolve
from posttrain.trainers.online_rl import OnlineRL, PromptStream, RLRun

# a random micro model solves nothing: the length reward makes rewards differ, so the advantages are not 0
RL = ["rl.max_new_tokens=4", "rl.prompts_per_step=3", "rl.group_size=3", "rl.overlong_buffer=3",
      "rl.rewards=[{name: correctness}, {name: overlong}]"]


@pytest.fixture(scope="module")
def micro(tmp_path_factory):
    return micro_rl_parts(tmp_path_factory.mktemp("off_policy"), RL, 30)


def two_steps(micro, **rl_updates):
    cfg, task, examples, tokenizer, state, model = micro
    model.load_state_dict(state)
    run = RLRun(model, tokenizer, task, examples, resolve.updated(cfg.rl, "rl", **rl_updates), seed=0, checkpoint_dir=REPO / "unused",
                config_hash="x")
    trainer, stream = OnlineRL(run, total_steps=2), PromptStream(examples, 0)
    history = [trainer.step(stream.take(3)).metrics for _ in range(2)]
    return history, {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_sync_mismatch_is_zero_and_every_correction_is_the_identity(micro):
    plain, weights = two_steps(micro)
    for h in plain:  # the sampler's recorded log-probs are the trainer's, up to the KV-cached decode's rounding
        assert h["mismatch/k3"] < 1e-9 and abs(h["mismatch/max_ratio"] - 1) < 1e-4 and abs(h["mismatch/min_ratio"] - 1) < 1e-4
        assert h["reward/overlong_std"] > 0 and h["advantage_abs_mean"] > 0  # a real signal
    moved = max(float((weights[k] - v).abs().max()) for k, v in micro[4].items())
    assert moved > 1e-4
    for name in ("tis", "mis", "decoupled"):
        history, other = two_steps(micro, correction=name)
        assert all(abs(h[f"{name}/weight_mean"] - 1) < 1e-4 and h[f"{name}/dropped_fraction"] == 0 for h in history)
        for key, value in weights.items():
            assert torch.allclose(other[key], value, atol=1e-5), (name, key)


def test_a_bf16_sampler_shows_as_a_small_mismatch_and_trains(micro):
    """`model.sampler_dtype: bfloat16` on the float32 micro model: the recorded log-probs now come from the bf16 decode,
    so the step measures a non-zero sampler-trainer gap (k3), small (below 1e-2 per token here), and the weights still
    move in float32."""
    from posttrain.models.decoders import use_sampler_dtype

    model = micro[5]
    use_sampler_dtype(model, torch.bfloat16)
    try:
        history, weights = two_steps(micro)
    finally:
        use_sampler_dtype(model, None)
    for h in history:
        assert 1e-9 < h["mismatch/k3"] < 1e-2, h["mismatch/k3"]
    assert all(v.dtype == torch.float32 for v in weights.values())
    assert max(float((weights[k] - v).abs().max()) for k, v in micro[4].items()) > 1e-4
