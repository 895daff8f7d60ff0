"""VLM-Safe-RL (specs §16): the invariants of PPO-Lagrangian with the VLM terms over hand-computed tensors, the
driving environment's costs and frames, and the frozen image-text encoder (built tiny from a config, saved and
loaded by path as a real CLIP checkpoint is)."""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from posttrain.recipes.safe_rl.driving import CAR_LENGTH, DrivingEnv, vocabulary
from posttrain.recipes.safe_rl.objective import (LagrangeMultiplier, episode_cost, lagrangian_advantage, ppo_lagrangian_loss,
                                                 safety_score, shaped_reward, violation)

ENV = SimpleNamespace(lanes=3, cars=3, horizon=6, image_size=16, speed_min=0.2, speed_max=1.0, speed_step=0.1, steer_step=0.25,
                      traffic_speed=(0.2, 0.5), danger_ttc=4.0, edge_margin=0.15)


# -- the multiplier -----------------------------------------------------------------------------------------------
def test_lambda_stays_nonnegative_and_rises_exactly_on_a_positive_violation():
    rng = random.Random(0)
    for _ in range(2000):
        lam0 = rng.choice([0.0, rng.uniform(0, 3)])
        args = dict(cost=rng.uniform(0, 3), limit=rng.uniform(0, 3), risk=rng.uniform(-2, 2), risk_threshold=rng.uniform(-1, 1),
                    kappa=rng.choice([0.0, rng.uniform(0, 1)]))
        m = LagrangeMultiplier(lam0, rng.uniform(0.001, 0.5))
        lam1 = m.update(**args)
        v = violation(**args)
        assert lam1 >= 0.0
        assert (lam1 > lam0) == (v > 0), (lam0, lam1, v)


def test_augmented_update_by_hand_and_kappa_zero_is_the_plain_update():
    m = LagrangeMultiplier(0.5, 0.1)
    assert m.update(cost=1.5, limit=1.0, risk=0.3, risk_threshold=0.1, kappa=0.5) == pytest.approx(0.5 + 0.1 * (0.5 + 0.5 * 0.2))
    plain, augmented = LagrangeMultiplier(0.5, 0.1), LagrangeMultiplier(0.5, 0.1)
    assert augmented.update(1.2, 1.0, risk=1.7, risk_threshold=-0.4, kappa=0.0) == plain.update(1.2, 1.0)
    assert LagrangeMultiplier(0.01, 0.1).update(0.0, 1.0) == 0.0  # projected onto lambda >= 0


def test_lambda_decays_to_zero_when_the_cost_stays_below_the_limit_with_kappa_zero():
    m, rng = LagrangeMultiplier(2.0, 0.05), random.Random(1)
    values = [m.update(cost=0.6, limit=1.0, risk=rng.uniform(-2, 2), risk_threshold=0.0, kappa=0.0) for _ in range(200)]
    assert all(b <= a for a, b in zip(values, values[1:])) and values[-1] == 0.0
    m.load_state_dict({"value": 0.7})
    assert m.state_dict() == {"value": 0.7}


# -- the VLM terms ------------------------------------------------------------------------------------------------
def test_safety_score_is_the_cosine_difference_in_minus_two_to_two():
    safe, danger = torch.tensor([1.0, 0.0]), torch.tensor([-2.0, 0.0])
    images = torch.tensor([[3.0, 0.0], [-1.0, 0.0], [0.0, 5.0], [1.0, 1.0]])
    assert torch.allclose(safety_score(images, safe, danger), torch.tensor([2.0, -2.0, 0.0, 2 ** 0.5]))
    rand = safety_score(torch.randn(500, 8), torch.randn(8), torch.randn(8))
    assert bool((rand >= -2).all() and (rand <= 2).all()) and float(rand.std()) > 0
    with pytest.raises(AssertionError, match="must not carry gradient"):
        safety_score(torch.randn(3, 8, requires_grad=True), torch.randn(8), torch.randn(8))


def test_alpha_zero_leaves_the_reward_unshaped():
    r, s = torch.rand(4, 5), torch.rand(4, 5) * 4 - 2
    assert shaped_reward(r, s, 0.0) is r
    assert torch.allclose(shaped_reward(r, s, 0.1), r + 0.1 * s)


def test_progress_normalised_cost_by_hand():
    costs = torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    progress = torch.tensor([0.5, 1.0, 0.05])
    assert torch.allclose(episode_cost(costs, progress, "progress", 0.1), torch.tensor([4.0, 0.0, 10.0]))
    assert torch.allclose(episode_cost(costs, progress, "episodic", 0.1), torch.tensor([2.0, 0.0, 1.0]))


def test_actor_gradient_follows_the_lagrangian_advantage():
    """At ratio 1 the clipped surrogate's gradient in logp_i is -A_i / n, A = (A_R - lambda A_C) / (1 + lambda)."""
    a_r, a_c = torch.tensor([1.0, -0.5, 2.0, 0.0]), torch.tensor([0.5, 1.0, -1.0, 2.0])
    assert torch.allclose(lagrangian_advantage(a_r, a_c, 0.0), a_r)
    for lam in (0.0, 1.0, 3.0):
        logp = torch.log(torch.tensor([0.2, 0.5, 0.3, 0.4])).requires_grad_()
        zeros = torch.zeros(4)
        loss, figures = ppo_lagrangian_loss(logp, logp.detach(), zeros, a_r, a_c, lam, zeros, zeros, zeros, zeros, zeros, zeros,
                                            clip_eps=0.2, value_clip=1.0, entropy_coef=0.0)
        loss.backward()
        assert torch.allclose(logp.grad, -((a_r - lam * a_c) / (1 + lam)) / 4)
        assert figures["value_loss"] == figures["cost_value_loss"] == 0.0  # V = returns: no value loss


def test_critic_losses_are_the_clipped_value_loss_of_each():
    vr, vc = torch.tensor([1.0, 2.0], requires_grad=True), torch.tensor([0.0, 3.0], requires_grad=True)
    zeros = torch.zeros(2)
    _, f = ppo_lagrangian_loss(zeros, zeros, zeros, zeros, zeros, 0.5, vr, vr.detach(), torch.tensor([2.0, 2.0]),
                               vc, vc.detach(), torch.tensor([0.0, 1.0]), clip_eps=0.2, value_clip=10.0, entropy_coef=0.0)
    assert f["value_loss"] == pytest.approx(0.5 * (1.0 + 0.0) / 2) and f["cost_value_loss"] == pytest.approx(0.5 * (0.0 + 4.0) / 2)


# -- the environment ---------------------------------------------------------------------------------------------
def test_environment_is_seeded_and_its_costs_are_collisions_and_road_exits():
    a, b = DrivingEnv(ENV, 4, 7), DrivingEnv(ENV, 4, 7)
    actions = np.random.default_rng(0).integers(5, size=(ENV.horizon, 4))
    for row in actions:
        ra, rb = a.step(row), b.step(row)
        assert np.array_equal(ra.cost, rb.cost) and np.array_equal(ra.reward, rb.reward)
    assert np.array_equal(a.render(), b.render()) and a.done.all()

    env = DrivingEnv(ENV, 2, 0)
    env.x[:] = [1.5, 0.35]  # episode 0: a car right in front, closing in; episode 1: at the left edge
    env.v[:] = 1.0
    env.car_x[:] = [[1.5, 2.5, 2.5], [2.5, 2.5, 2.5]]
    env.car_y[:] = [[CAR_LENGTH + 0.3, 10.0, 12.0], [10.0, 11.0, 12.0]]
    env.car_v[:] = 0.2
    caps = env.captions()
    assert caps[0][0] == "a car about to crash into another vehicle" and caps[0][1] == "car ahead in my lane close"
    assert caps[1][0] == "a car about to leave the road" and caps[1][2] == "no lane on my left"
    step = env.step(np.array([0, 1]))  # keep (runs into the car), steer left (off the road)
    assert step.collision.tolist() == [1, 0] and step.road_exit.tolist() == [False, True]
    assert step.cost.tolist() == [1.0, 1.0] and step.done.tolist() == [False, True]
    assert env.car_y[0, 0] > 10  # the car hit is respawned ahead
    assert step.reward.tolist() == [1.0, 1.0] and set(w for c in caps for p in c for w in p.split()) <= set(vocabulary())


def test_frames_show_the_ego_car_and_other_cars():
    env = DrivingEnv(ENV, 2, 0)
    env.car_y[0] = [3.0, 30.0, 40.0]  # one car in view in episode 0, none in episode 1
    env.car_y[1] = [30.0, 40.0, 50.0]
    frames = env.render()
    assert frames.shape == (2, 16, 16, 3) and frames.dtype == np.uint8
    red = (frames[..., 0] > 200) & (frames[..., 1] < 80)
    blue = (frames[..., 2] > 200) & (frames[..., 0] < 80)
    assert red.any(axis=(1, 2)).all() and blue.any(axis=(1, 2)).tolist() == [True, False]
    env.x[0] = 0.5
    assert not np.array_equal(env.render()[0], frames[0])  # the camera sees the ego car move


# -- the frozen encoder -------------------------------------------------------------------------------------------
def tiny_encoder(seed: int = 0):
    from posttrain.models.image_text import ImageTextEncoder, tiny_clip

    torch.manual_seed(seed)
    return ImageTextEncoder(*tiny_clip(vocabulary(), 16, 8, 16, 1, 2, 8))


def test_the_encoders_carry_no_gradient():
    encoder = tiny_encoder()
    frames = DrivingEnv(ENV, 3, 0).render()
    images, texts = encoder.embed_images(frames), encoder.embed_texts(["driving fast", "my lane is clear"])
    assert not any(p.requires_grad for p in encoder.model.parameters()) and not encoder.model.training
    assert not images.requires_grad and not texts.requires_grad and images.shape == (3, 8)
    assert torch.allclose(images.norm(dim=-1), torch.ones(3)) and torch.allclose(texts.norm(dim=-1), torch.ones(2))
    encoder.assert_frozen(images, texts)
    encoder.model.text_projection.weight.requires_grad_(True)
    with pytest.raises(AssertionError, match="not frozen"):
        encoder.assert_frozen(images)


def test_a_clip_checkpoint_in_the_hub_layout_loads_by_path_through_the_same_interface(tmp_path):
    """A tiny CLIPModel built from a config, saved with a CLIPTokenizer and a CLIPImageProcessor as a hub checkpoint is
    (nothing downloads), embeds through ImageTextEncoder.load exactly as through transformers' own processors."""
    import json
    import string

    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPTokenizer

    from posttrain.models.image_text import ImageTextEncoder, _features

    letters = list(string.ascii_lowercase)
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1, **{t: i + 2 for i, t in enumerate(letters + [c + "</w>" for c in letters])}}
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    (tmp_path / "merges.txt").write_text("#version: 0.2\n")
    tokenizer = CLIPTokenizer(str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt"))
    small = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}
    torch.manual_seed(0)
    model = CLIPModel(CLIPConfig(text_config={**small, "vocab_size": len(vocab), "eos_token_id": 1, "bos_token_id": 0, "pad_token_id": 1},
                                 vision_config={**small, "image_size": 16, "patch_size": 8}, projection_dim=8))
    processor = CLIPImageProcessor(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16})
    checkpoint = tmp_path / "clip"
    for part in (model, tokenizer, processor):
        part.save_pretrained(checkpoint)
    encoder = ImageTextEncoder.load(checkpoint)
    frames = DrivingEnv(ENV, 2, 0).render()
    texts = ["a car driving safely", "a crash"]
    with torch.no_grad():  # transformers' own path: its processor and tokenizer, the projected pooled output
        pixels = processor(images=list(frames), return_tensors="pt").pixel_values
        want_images = _features(model.get_image_features(pixel_values=pixels))
        want_texts = _features(model.get_text_features(**tokenizer(texts, padding=True, return_tensors="pt")))
    assert torch.allclose(encoder.embed_images(frames), torch.nn.functional.normalize(want_images, dim=-1), atol=1e-5)
    assert torch.allclose(encoder.embed_texts(texts), torch.nn.functional.normalize(want_texts, dim=-1), atol=1e-5)
    assert encoder.dim == 8 and not any(p.requires_grad for p in encoder.model.parameters())


def test_alpha_clip_and_kappa_zero_is_plain_ppo_lagrangian():
    """With alpha_clip = kappa = 0 the VLM score enters nowhere: replacing the prompts (every s_t changes) leaves the
    agent after a round and lambda unchanged; with alpha_clip > 0 the agent changes, with kappa > 0 lambda does."""
    from helpers import REPO
    from posttrain.resolve import load
    from posttrain.trainers.loop import TrainLoop
    from posttrain.recipes.safe_rl.trainer import SafeRL

    micro = ["safe_rl.env.image_size=16", "safe_rl.env.horizon=5", "safe_rl.env.cars=2", "safe_rl.envs=3", "safe_rl.epochs=1",
             "safe_rl.minibatches=1", "safe_rl.lambda_init=0.5", "safe_rl.cost_limit=0.0"]
    base, encoder = load(REPO / "params.yaml", micro).safe_rl, tiny_encoder()
    other = encoder.embed_texts(["driving slowly", "no lane on my left"])

    def one_round(alpha: float, kappa: float, other_prompts: bool):
        trainer = SafeRL(base.model_copy(update={"alpha_clip": alpha, "kappa": kappa}), encoder, seed=3)
        if other_prompts:
            trainer.prompts = other
        figures = trainer.round(1, TrainLoop())
        return torch.cat([p.detach().flatten() for p in trainer.agent.parameters()]), trainer.multiplier.value, figures["safety_score"]

    plain, lam, score = one_round(0.0, 0.0, False)
    swapped, swapped_lam, swapped_score = one_round(0.0, 0.0, True)
    assert torch.equal(plain, swapped) and lam == swapped_lam and score != swapped_score
    assert not torch.equal(one_round(0.5, 0.0, False)[0], one_round(0.5, 0.0, True)[0])
    assert one_round(0.0, 0.5, False)[1] != one_round(0.0, 0.5, True)[1]


def test_a_prompt_outside_the_encoders_vocabulary_is_refused_with_its_key():
    from helpers import REPO
    from posttrain.errors import UserError
    from posttrain.resolve import load
    from posttrain.recipes.safe_rl.trainer import SafeRL

    cfg = load(REPO / "params.yaml", ["safe_rl.danger_prompt=a zebra on the road"]).safe_rl
    with pytest.raises(UserError, match="safe_rl.danger_prompt.*'zebra'"):
        SafeRL(cfg, tiny_encoder(), seed=0)
