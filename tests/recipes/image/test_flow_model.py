"""The conditional flow model: save / from_pretrained round trip, LoRA through peft (merged on save), the
instruction encoder, and the samplers on a tiny model (ratio = 1 on the first update through the network)."""

from __future__ import annotations

import torch

from helpers import repo_params
from posttrain.config import LoraConfig
from posttrain.recipes.image.settings import FlowModelConfig
from posttrain.recipes.image.flow import build_flow_model, instruction_features, load_flow_model, maybe_flow_lora, save_flow_model
from posttrain.objectives.flow_grpo import sde_step
from posttrain.recipes.image.eval import sample_ode
from posttrain.recipes.image.policy import sample_sde, sigma_schedule

CFG = FlowModelConfig.model_validate({**repo_params()["flow"], "block_channels": [8, 16], "text_dim": 16})
LORA = LoraConfig(r=2, alpha=4, dropout=0.0, target_modules=("conv1", "conv2", "to_q", "to_v"))


def inputs(n: int = 2, size: int = 8):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 3, size, size, generator=g), torch.randn(n, 9, size, size, generator=g), instruction_features(["remove the tree on the left side"] * n, 16)


def test_save_and_load_give_the_same_function(tmp_path):
    torch.manual_seed(0)
    model = build_flow_model(CFG, 8).eval()
    x, cond, text = inputs()
    save_flow_model(model, tmp_path / "m")
    loaded = load_flow_model(tmp_path / "m").eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(x, torch.tensor(0.5), cond, text), model(x, torch.tensor(0.5), cond, text))
    assert loaded.image_size == 8 and loaded.text_dim == 16


def test_lora_trains_only_adapters_and_merges_into_a_plain_model(tmp_path):
    torch.manual_seed(0)
    base = build_flow_model(CFG, 8)
    save_flow_model(base, tmp_path / "base")
    model = maybe_flow_lora(load_flow_model(tmp_path / "base"), LORA)  # the real-checkpoint path: from_pretrained + LoRA
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    with torch.no_grad():  # move the adapters off zero so that merging matters
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    x, cond, text = inputs()
    model.eval()
    with torch.no_grad():
        expected = model(x, torch.tensor(0.3), cond, text)
    save_flow_model(model, tmp_path / "merged")
    merged = load_flow_model(tmp_path / "merged").eval()
    assert not any("lora_" in n for n, _ in merged.named_parameters())
    with torch.no_grad():
        torch.testing.assert_close(merged(x, torch.tensor(0.3), cond, text), expected, atol=1e-5, rtol=1e-5)


def test_instruction_features_are_stable_and_normalised():
    a = instruction_features(["Remove the building on the left side", "add a tree on the right side"], 64)
    b = instruction_features(["remove the building on the LEFT side", "add a tree on the right side"], 64)
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(a.norm(dim=1), torch.ones(2))
    assert not torch.allclose(a[0], a[1])


def test_sde_sampler_logp_is_reproduced_by_the_training_pass():
    """Flow-GRPO invariant 2 through the network: re-scoring each recorded transition gives ratio 1."""
    torch.manual_seed(0)
    model = build_flow_model(CFG, 8).eval()
    _, cond, text = inputs(3)
    sigmas = sigma_schedule(4)
    traj = sample_sde(model, cond, text, sigmas, 0.7, torch.Generator().manual_seed(1))
    assert traj.states.shape == (5, 3, 3, 8, 8) and traj.logp.shape == (4, 3)
    for j, (s, s_prev) in enumerate(zip(sigmas[:-1], sigmas[1:])):
        x = traj.states[j]
        step = sde_step(x, model(x, torch.tensor(s), cond, text), s, s_prev, 0.7, sigmas[1], prev=traj.states[j + 1])
        torch.testing.assert_close(step.logp.detach(), traj.logp[j], atol=1e-4, rtol=1e-5)


def test_ode_sampler_is_the_zero_noise_sde_sampler():
    torch.manual_seed(0)
    model = build_flow_model(CFG, 8).eval()
    _, cond, text = inputs(2)
    ode = sample_ode(model, cond, text, 4, torch.Generator().manual_seed(5))
    sde = sample_sde(model, cond, text, sigma_schedule(4), 0.0, torch.Generator().manual_seed(5))
    torch.testing.assert_close(sde.final, ode, atol=1e-5, rtol=1e-5)


def test_only_the_stochastic_head_injects_noise():
    """timestep_fraction: SDE steps first, then Euler steps that leave the state a function of the head."""
    torch.manual_seed(0)
    model = build_flow_model(CFG, 8).eval()
    _, cond, text = inputs(2)
    sigmas = sigma_schedule(4)
    traj = sample_sde(model, cond, text, sigmas, 0.7, torch.Generator().manual_seed(2), stochastic=2)
    assert (traj.logp[2:] == 0).all() and (traj.logp[:2] != 0).all()
    for j in (2, 3):  # the tail is the Euler step from the recorded state
        x = traj.states[j]
        with torch.no_grad():
            euler = x + model(x, torch.tensor(sigmas[j]), cond, text) * (sigmas[j + 1] - sigmas[j])
        torch.testing.assert_close(traj.states[j + 1], euler)
