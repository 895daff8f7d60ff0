"""Parity with TRL's own GRPOTrainer code paths (trl 1.16), on a tiny offline model.

Losses: TRL's `_compute_loss(model, inputs)` recomputes the per-token log-probs from the model; ours gets them
from `completion_logprobs` on the same model and weights. Both losses and their gradients on every weight are
compared. Prompts all have the same length (TRL's forward ignores left padding in its position ids).
Advantages: TRL's `_generate_and_score_completions` is run for real (it generates with the tiny model); its
reward functions return a fixed reward matrix (None -> NaN) so the advantages it computes can be compared
with ours on the same matrix.
"""

from __future__ import annotations

import math
import warnings
from types import SimpleNamespace

import pytest
import torch

from posttrain.models import build_tiny, train_char_tokenizer
from posttrain.models.logprobs import completion_logprobs
from posttrain.objectives import advantages, losses
from posttrain.objectives.aggregation import aggregate
from posttrain.objectives.kl import k3_kl
from posttrain.rollout import RolloutBatch

import trl  # noqa: E402, F401  (a dev dependency: parity must fail loudly, never skip, without it)
B, G, P, T, L_MAX = 6, 3, 4, 5, 7


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    warnings.filterwarnings("ignore")
    tokenizer = train_char_tokenizer(["0123456789+=- "])
    cfg = SimpleNamespace(
        arch="qwen2", hidden_size=32, layers=1, heads=4, kv_heads=2, intermediate_size=64, max_positions=32, dtype="float32",
    )
    torch.manual_seed(0)
    return tokenizer, build_tiny(cfg, tokenizer), tmp_path_factory.mktemp("trl")


def make_trainer(tiny, reward_funcs=None, weights=None, **args):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    tokenizer, model, out = tiny
    beta = args.pop("beta", 0.0)  # built with beta 0: TRL would load a reference model from a hub path otherwise
    config = GRPOConfig(
        output_dir=str(out), per_device_train_batch_size=B, num_generations=G, max_completion_length=L_MAX, temperature=1.0,
        top_p=1.0, top_k=0, use_cpu=True, bf16=False, fp16=False, report_to="none", save_strategy="no", disable_tqdm=True,
        mask_truncated_completions=False, reward_weights=weights, **args,
    )
    funcs = reward_funcs or [lambda completions, **_: [0.0] * len(completions)]
    data = Dataset.from_list([{"prompt": "12+3"}] * B)
    trainer = GRPOTrainer(model=model, reward_funcs=funcs, args=config, train_dataset=data, processing_class=tokenizer)
    trainer.current_gradient_accumulation_steps = 1
    trainer.beta = beta  # the loss path reads self.beta and takes the reference log-probs from `inputs`
    return trainer


def loss_inputs(model):
    g = torch.Generator().manual_seed(1)
    prompt_ids = torch.randint(3, 12, (B, P), generator=g)
    completion_ids = torch.randint(3, 12, (B, T), generator=g)
    lengths = torch.tensor([5, 3, 1, 4, 5, 2])
    mask = (torch.arange(T)[None] < lengths[:, None]).long()
    with torch.no_grad():
        logp, _ = completion_logprobs(model, prompt_ids, torch.ones_like(prompt_ids), completion_ids, mask)
    old = (logp + 0.3 * torch.randn(B, T, generator=g)) * mask  # ratios well off 1: clipping binds
    ref = (logp + 0.2 * torch.randn(B, T, generator=g)) * mask
    adv = torch.tensor([1.2, -0.7, 0.4, -1.5, 0.9, -0.3])
    return {
        "prompt_ids": prompt_ids, "prompt_mask": torch.ones_like(prompt_ids), "completion_ids": completion_ids,
        "completion_mask": mask, "advantages": adv, "old_per_token_logps": old, "ref_per_token_logps": ref,
        "num_items_in_batch": mask.sum().float(),
    }


def grads(model, loss):
    model.zero_grad(set_to_none=True)
    loss.backward()
    out = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    model.zero_grad(set_to_none=True)
    return out


# mode: (TRL GRPOConfig args, our rl settings)
# TRL 1.16 multiplies the KL by the IS ratio by default (DeepSeek-V3.2's bias correction); ours is the plain
# k3 penalty of DeepSeekMath eq. 4, which is TRL with use_bias_correction_kl=False.
MODES = {
    "grpo": (dict(loss_type="grpo", epsilon=0.2, epsilon_high=0.2, beta=0.04, use_bias_correction_kl=False),
             dict(loss="clip", loss_agg="seq_mean", clip_eps_low=0.2, clip_eps_high=0.2, beta=0.04)),
    "dr_grpo": (dict(loss_type="dr_grpo", epsilon=0.2, epsilon_high=0.2, beta=0.0),
                dict(loss="clip", loss_agg="token_sum_norm", clip_eps_low=0.2, clip_eps_high=0.2, beta=0.0)),
    "dapo": (dict(loss_type="dapo", epsilon=0.2, epsilon_high=0.28, beta=0.0),
             dict(loss="clip", loss_agg="token_mean", clip_eps_low=0.2, clip_eps_high=0.28, beta=0.0)),
    "gspo": (dict(loss_type="grpo", importance_sampling_level="sequence", epsilon=3e-4, epsilon_high=4e-4, beta=0.0),
             dict(loss="gspo", loss_agg="seq_mean", clip_eps_low=3e-4, clip_eps_high=4e-4, beta=0.0)),
    # TRL's cispo epsilon_high is the absolute cap on the IS weight (ScaleRL's eps_max) = 1 + our clip_eps_high
    "cispo": (dict(loss_type="cispo", epsilon=0.2, epsilon_high=1.1, beta=0.0),
              dict(loss="cispo", loss_agg="token_mean", clip_eps_low=0.2, clip_eps_high=0.1, beta=0.0)),
}


@pytest.mark.parametrize("mode", list(MODES))
def test_loss_and_gradient_match_trl(tiny, mode):
    trl_args, ours = MODES[mode]
    trainer = make_trainer(tiny, **trl_args)
    model = trainer.model
    model.train()
    inputs = loss_inputs(model)
    theirs = trainer._compute_loss(model, inputs)
    their_grad = grads(model, theirs)

    cfg = SimpleNamespace(max_new_tokens=L_MAX, **ours)
    mask = inputs["completion_mask"]
    logp, _ = completion_logprobs(model, inputs["prompt_ids"], inputs["prompt_mask"], inputs["completion_ids"], mask)
    loss, _ = losses.get(cfg.loss)(logp, inputs["old_per_token_logps"], inputs["advantages"], mask, cfg)
    if cfg.beta > 0:
        loss = loss + cfg.beta * aggregate(cfg, k3_kl(logp, inputs["ref_per_token_logps"]), mask)
    our_grad = grads(model, loss)
    loss_diff = abs(float(loss) - float(theirs))
    grad_diff = float((our_grad - their_grad).abs().max())
    print(f"PARITY {mode}: |loss diff| = {loss_diff:.3e}, max |grad diff| = {grad_diff:.3e}")
    assert loss_diff < 1e-6
    assert grad_diff < 1e-6
    assert float(their_grad.abs().max()) > 1e-4, "a vacuous comparison: no gradient"


REWARDS = [  # [B, 2]; group 0 has a constant second column, row 4 is unscorable, row 5 misses one reward
    [1.0, 0.5], [0.0, 0.5], [1.0, 0.5],
    [0.0, 2.0], [None, None], [1.0, None],
]
WEIGHTS = [1.0, 0.3]


@pytest.mark.parametrize("aggregation,ours", [("sum_then_normalize", "sum_then_normalize"), ("normalize_then_sum", "gdpo")])
def test_multi_reward_advantages_match_trl(tiny, aggregation, ours):
    funcs = [
        lambda completions, row, **_: [REWARDS[i][0] for i in row],
        lambda completions, row, **_: [REWARDS[i][1] for i in row],
    ]
    trainer = make_trainer(tiny, funcs, WEIGHTS, multi_objective_aggregation=aggregation, scale_rewards="group")
    trainer.model.train()
    inputs = [{"prompt": "12+3", "row": i} for i in range(B)]
    theirs = trainer._generate_and_score_completions(inputs)["advantages"]

    rewards = torch.tensor([[float("nan") if v is None else v for v in row] for row in REWARDS])
    batch = RolloutBatch(
        prompt_ids=torch.zeros(B, 1, dtype=torch.long), prompt_mask=torch.ones(B, 1, dtype=torch.long),
        completion_ids=torch.zeros(B, 1, dtype=torch.long), completion_mask=torch.ones(B, 1, dtype=torch.long),
        group=torch.arange(B // G).repeat_interleave(G), old_logp=torch.zeros(B, 1), rewards=rewards,
        reward_names=("a", "b"), reward_weights=torch.tensor(WEIGHTS),
    )
    mine = advantages.get(ours)(batch, SimpleNamespace(std_scaling="group", std_eps=1e-4))
    diff = float((mine - theirs).abs().max())
    print(f"PARITY {ours}: max |advantage diff| = {diff:.3e}")
    assert diff < 1e-6
    assert float(theirs.abs().max()) > 0.1


# --- the 2026 catalogue (docs/objectives.md): TRL 1.16's other loss types, its sampler IS correction and OPSM ---------

from posttrain.objectives.off_policy import corrections, weighted_advantages  # noqa: E402
from posttrain.objectives.opsm import OPSMOptions  # noqa: E402
from posttrain.objectives.sampler_is import SamplerISOptions  # noqa: E402
from posttrain.objectives.sapo import SAPOOptions  # noqa: E402
from posttrain.objectives.vespo import VESPOOptions  # noqa: E402

CATALOGUE = {
    "bnpo": (dict(loss_type="bnpo", epsilon=0.2, epsilon_high=0.28, beta=0.0),
             dict(loss="clip", loss_agg="token_mean", clip_eps_low=0.2, clip_eps_high=0.28), {}),
    "sapo": (dict(loss_type="sapo", sapo_temperature_pos=1.0, sapo_temperature_neg=1.05, beta=0.0),
             dict(loss="sapo", loss_agg="seq_mean"), {"sapo": SAPOOptions(tau_pos=1.0, tau_neg=1.05)}),
    "luspo": (dict(loss_type="luspo", importance_sampling_level="sequence", epsilon=3e-4, epsilon_high=4e-4, beta=0.0),
              dict(loss="gspo", loss_agg="seq_mean_token_sum", clip_eps_low=3e-4, clip_eps_high=4e-4), {}),
    "vespo": (dict(loss_type="vespo", beta=0.0),
              dict(loss="vespo", loss_agg="token_mean"), {"vespo": VESPOOptions(k_pos=2.0, lambda_pos=3.0, k_neg=3.0, lambda_neg=2.0)}),
}


def catalogue_cfg(ours: dict, options: dict) -> SimpleNamespace:
    base = dict(clip_eps_low=0.2, clip_eps_high=0.2, beta=0.0)
    return SimpleNamespace(max_new_tokens=L_MAX, options_for=lambda name: options.get(name), **{**base, **ours})


def our_loss(model, inputs, cfg, old_logp=None, advantages=None):
    mask = inputs["completion_mask"]
    logp, _ = completion_logprobs(model, inputs["prompt_ids"], inputs["prompt_mask"], inputs["completion_ids"], mask)
    old = inputs["old_per_token_logps"] if old_logp is None else old_logp
    adv = inputs["advantages"] if advantages is None else advantages
    return logp, losses.get(cfg.loss)(logp, old, adv, mask, cfg)


def check_against(trainer, model, theirs, ours, name):
    their_grad = grads(model, theirs)
    our_grad = grads(model, ours)
    loss_diff = abs(float(ours) - float(theirs))
    grad_diff = float((our_grad - their_grad).abs().max())
    print(f"PARITY {name}: |loss diff| = {loss_diff:.3e}, max |grad diff| = {grad_diff:.3e}")
    assert loss_diff < 1e-6 and grad_diff < 1e-6
    assert float(their_grad.abs().max()) > 1e-4, "a vacuous comparison: no gradient"


@pytest.mark.parametrize("mode", list(CATALOGUE))
def test_catalogue_losses_match_trl(tiny, mode):
    trl_args, ours, options = CATALOGUE[mode]
    trainer = make_trainer(tiny, **trl_args)
    model = trainer.model
    model.train()
    inputs = loss_inputs(model)
    theirs = trainer._compute_loss(model, inputs)
    _, (loss, metrics) = our_loss(model, inputs, catalogue_cfg(ours, options))
    check_against(trainer, model, theirs, loss, mode)


def sampling_logps(inputs, seed=5):
    g = torch.Generator().manual_seed(seed)
    mask = inputs["completion_mask"]
    return (inputs["old_per_token_logps"] + 0.5 * torch.randn(mask.shape, generator=g)) * mask


def trl_is_ratio(old, sampling, mask, mode, clip_min, clip_max):
    """A transcription of trl 1.16 GRPOTrainer._generate_and_score_completions' vLLM importance-sampling ratio (that
    code path needs vLLM to run); the loss it feeds is TRL's own _compute_loss."""
    diff = torch.nan_to_num((old - sampling) * mask, nan=0.0)
    ratio = torch.exp(diff.sum(dim=-1, keepdim=True) if mode.startswith("sequence") else diff)
    if mode.endswith("truncate"):
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    lo = clip_min if clip_min is not None else -math.inf
    hi = clip_max if clip_max is not None else math.inf
    return ratio.masked_fill((ratio < lo) | (ratio > hi), value=0.0)


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
def test_sampler_is_matches_trl_vllm_importance_sampling(tiny, mode):
    trainer = make_trainer(tiny, loss_type="dapo", epsilon=0.2, epsilon_high=0.28, beta=0.0)
    model = trainer.model
    model.train()
    inputs = loss_inputs(model)
    mask = inputs["completion_mask"]
    sampling = sampling_logps(inputs)
    low, high = 0.5, 1.6
    inputs["importance_sampling_ratio"] = trl_is_ratio(inputs["old_per_token_logps"], sampling, mask, mode, low, high)
    trainer.use_vllm, trainer.vllm_importance_sampling_correction = True, True
    theirs = trainer._compute_loss(model, inputs)

    level, how = mode.split("_")
    fixed = corrections.get("sampler_is")(sampling, inputs["old_per_token_logps"], mask, SamplerISOptions(level=level, mode=how, low=low, high=high))
    assert 0 < fixed.metrics["sampler_is/clipped_fraction"] < 1
    cfg = catalogue_cfg(dict(loss="clip", loss_agg="token_mean", clip_eps_low=0.2, clip_eps_high=0.28), {})
    _, (loss, _) = our_loss(model, inputs, cfg, fixed.old_logp, weighted_advantages(inputs["advantages"], fixed.weight))
    check_against(trainer, model, theirs, loss, f"sampler_is/{mode}")


def test_opsm_matches_trl_off_policy_mask(tiny):
    delta = 0.05
    trainer = make_trainer(tiny, loss_type="dapo", epsilon=0.2, epsilon_high=0.28, beta=0.0, off_policy_mask_threshold=delta)
    model = trainer.model
    model.train()
    inputs = loss_inputs(model)
    mask = inputs["completion_mask"]
    with torch.no_grad():  # the first pass of an update: TRL's current log-probs are the proximal ones
        current, _ = completion_logprobs(model, inputs["prompt_ids"], inputs["prompt_mask"], inputs["completion_ids"], mask)
    inputs["old_per_token_logps"] = current * mask
    inputs["sampling_per_token_logps"] = sampling_logps(inputs, seed=9)
    theirs = trainer._compute_loss(model, inputs)

    fixed = corrections.get("opsm")(inputs["sampling_per_token_logps"], inputs["old_per_token_logps"], mask, OPSMOptions(delta=delta),
                                    advantages=inputs["advantages"])
    assert 0 < fixed.metrics["opsm/masked_fraction"] < 1
    cfg = catalogue_cfg(dict(loss="clip", loss_agg="token_mean", clip_eps_low=0.2, clip_eps_high=0.28), {})
    _, (loss, _) = our_loss(model, inputs, cfg, fixed.old_logp, weighted_advantages(inputs["advantages"], fixed.weight))
    check_against(trainer, model, theirs, loss, "opsm")
