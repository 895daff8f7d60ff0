"""`flow.kind: flux`: a tiny FLUX-family checkpoint built from configs and saved by FluxKontextPipeline, loaded
by path, one flow_sft step and one flow_rl step through LoRA adapters (base frozen), adapters saved and
reloaded giving the same function. Offline (conftest sets HF_HUB_OFFLINE=1)."""

from __future__ import annotations

import pytest
import torch

from helpers import repo_params, REPO
from posttrain.recipes.image.settings import FlowModelConfig, FlowRLConfig, FlowSFTConfig
from posttrain.recipes.image.vigor.edits import Edits
from posttrain.errors import UserError
from posttrain.recipes.image.flow import load_flow_model, save_flow_model, start_flow_model
from posttrain.recipes.image.flux import FluxEditModel, write_tiny_flux_checkpoint
from posttrain.trainers.checkpoint import load_checkpoint, save_checkpoint
from posttrain.recipes.image.grpo import train_flow_rl
from posttrain.recipes.image.policy import sample_sde, sigma_schedule
from posttrain.recipes.image.sft import train_flow_sft

PARAMS = repo_params()
SIZE = 16


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_tiny_flux_checkpoint(tmp_path_factory.mktemp("flux") / "tiny-flux")


def flux_cfg(path) -> FlowModelConfig:
    lora = {"r": 2, "alpha": 4, "dropout": 0.0, "target_modules": ["to_q", "to_k", "to_v", "to_out.0"]}
    return FlowModelConfig.model_validate({**PARAMS["flow"], "kind": "flux", "path": str(path), "image_size": SIZE, "lora": lora})


def edits(n: int = 2) -> Edits:
    g = torch.Generator().manual_seed(0)
    images = torch.rand(n, 4, 3, SIZE, SIZE, generator=g) * 2 - 1
    mask = torch.zeros(n, 1, SIZE, SIZE)
    mask[..., : SIZE // 3] = 1
    return Edits(images[:, 0], images[:, 1], images[:, 1:].reshape(n, 9, SIZE, SIZE), mask,
                 ("remove the tree on the left side",) * n, ("vegetation",) * n)


def test_flux_kind_needs_a_checkpoint_and_lora():
    from posttrain import resolve

    with pytest.raises(UserError, match="flow: kind flux needs"):  # a registry meta rule, checked by resolve
        resolve.load(REPO / "params.yaml", ["flow.kind=flux"])


def test_load_by_path_train_sft_and_rl_steps_and_reload_adapters(checkpoint, tmp_path):
    torch.manual_seed(0)
    model = start_flow_model(flux_cfg(checkpoint), SIZE)
    assert isinstance(model, FluxEditModel) and model.has_adapters
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)  # base, VAE and text encoders are frozen
    base_before = {n: p.clone() for n, p in model.named_parameters() if not p.requires_grad}
    lora_before = {n: p.clone() for n, p in model.named_parameters() if p.requires_grad}

    sft = FlowSFTConfig.model_validate({**PARAMS["flow_sft"], "steps": 1, "batch_size": 2, "warmup_steps": 0, "log_every": 1})
    assert torch.isfinite(torch.tensor(train_flow_sft(model, edits(), sft, 0, on_log=lambda *_: None)[0]["loss"]))
    rl = FlowRLConfig.model_validate({**PARAMS["flow_rl"], "steps": 1, "prompts_per_step": 1, "group_size": 2, "sampling_steps": 3,
                                      "timestep_fraction": 1.0, "checkpoint_every": 0})
    history = train_flow_rl(model, edits(), rl, 0, on_log=lambda *_: None)
    assert history[0]["ratio_mean"] == pytest.approx(1.0, abs=1e-4) and history[0]["grad_norm"] > 0
    assert any(not torch.equal(p, lora_before[n]) for n, p in model.named_parameters() if n in lora_before)
    assert all(torch.equal(p, base_before[n]) for n, p in model.named_parameters() if n in base_before)

    batch = edits()
    text, cond = model.encode_text(list(batch.instructions)), model.encode_conditions(batch.conditions)
    assert cond.shape == (2, 3 * model.grid**2, 16)  # three conditioning images appended as tokens
    trajectory = sample_sde(model, cond, text, sigma_schedule(3), 0.7, torch.Generator().manual_seed(1))
    assert trajectory.logp.shape == (3, 2) and (trajectory.logp != 0).all()  # per-step log-probs of the SDE sampler
    assert model.from_latent(trajectory.final).shape == (2, 3, SIZE, SIZE)

    save_flow_model(model, tmp_path / "adapters")
    assert (tmp_path / "adapters" / "transformer_lora" / "adapter_model.safetensors").is_file()
    assert not (tmp_path / "adapters" / "transformer_lora" / "diffusion_pytorch_model.safetensors").exists()
    reloaded = load_flow_model(tmp_path / "adapters").eval()
    # flow_rl's resume checkpoints hold the whole module (adapters, frozen base, tied T5 embeddings) and load back
    load_checkpoint(save_checkpoint(tmp_path / "checkpoints", 1, model, {"config_hash": "h"}), reloaded, "h")
    x = torch.randn(model.latent_shape(2), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(reloaded(x, torch.tensor(0.4), cond, text), model.eval()(x, torch.tensor(0.4), cond, text))


def test_adapters_of_a_vanished_base_stop_with_a_clear_error(checkpoint, tmp_path):
    import json
    import shutil

    base = tmp_path / "base"
    shutil.copytree(checkpoint, base)
    model = start_flow_model(flux_cfg(base), SIZE)
    save_flow_model(model, tmp_path / "adapters")
    assert json.loads((tmp_path / "adapters" / "flow_config.json").read_text())["base"] == str(base.resolve())
    shutil.rmtree(base)
    with pytest.raises(UserError, match="not there any more"):
        load_flow_model(tmp_path / "adapters")
