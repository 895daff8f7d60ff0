"""Parity of `dpo` with TRL's DPOTrainer (trl 1.16, loss_type "sigmoid") on a tiny offline model.

TRL's `_compute_loss(model, inputs)` computes the policy's sequence log-probs itself (its fused LM head) from
right-padded [chosen rows; rejected rows]; ours comes from `trainers.preference.sequence_logps` on the same
model and weights (left-padded prompts, rows interleaved). The reference log-probs are identical tensors
given to both (TRL's precomputed-reference path). Losses and gradients on every weight are compared.
"""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
import torch

from posttrain.data.preferences import PreferencePair
from posttrain.models import build_tiny, train_char_tokenizer
from posttrain.objectives.preference import PairLogps, preference_objectives
from posttrain.trainers.preference import encode_pairs, sequence_logps

from test_trl_parity import grads  # noqa: E402  (the same gradient flattening as the GRPO parity)

import trl  # noqa: E402,F401  (a dev dependency: parity must fail loudly, never skip, without it)

PAIRS = [("12+3=", "15", "16"), ("40+2=", "42", "4"), ("07+7=", "14", "1=4"), ("55+5=", "60", "600")]
BETA = 0.1


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    warnings.filterwarnings("ignore")
    tokenizer = train_char_tokenizer(["0123456789+=- "])
    cfg = SimpleNamespace(arch="qwen2", hidden_size=32, layers=1, heads=4, kv_heads=2, intermediate_size=64, max_positions=32, dtype="float32")
    torch.manual_seed(0)
    return tokenizer, build_tiny(cfg, tokenizer), tmp_path_factory.mktemp("trl_dpo")


def trl_inputs(tokenizer, ref_chosen, ref_rejected):
    """TRL's collated batch: [chosen rows; rejected rows], prompt + completion + EOS, right-padded."""
    rows, masks = [], []
    for side in (1, 2):
        for pair in PAIRS:
            prompt = tokenizer.encode(pair[0], add_special_tokens=False)
            completion = tokenizer.encode(pair[side], add_special_tokens=False) + [tokenizer.eos_token_id]
            rows.append(prompt + completion)
            masks.append([0] * len(prompt) + [1] * len(completion))
    width = max(map(len, rows))
    ids = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows])
    attention = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    completion = torch.tensor([m + [0] * (width - len(m)) for m in masks])
    return {"input_ids": ids, "attention_mask": attention, "completion_mask": completion, "ref_chosen_logps": ref_chosen, "ref_rejected_logps": ref_rejected}


def test_dpo_loss_and_gradient_match_trl_sigmoid(tiny):
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    tokenizer, model, out = tiny
    args = DPOConfig(
        output_dir=str(out), per_device_train_batch_size=len(PAIRS), beta=BETA, loss_type=["sigmoid"], use_cpu=True, bf16=False,
        report_to="none", save_strategy="no", disable_tqdm=True, precompute_ref_log_probs=True,
    )
    data = Dataset.from_list([{"prompt": p, "chosen": c, "rejected": r} for p, c, r in PAIRS])
    trainer = DPOTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer)
    model = trainer.model
    model.train()
    g = torch.Generator().manual_seed(3)
    ref_chosen, ref_rejected = -5 + torch.randn(len(PAIRS), generator=g), -6 + torch.randn(len(PAIRS), generator=g)
    theirs = trainer._compute_loss(model, trl_inputs(tokenizer, ref_chosen, ref_rejected), return_outputs=False)
    their_grad = grads(model, theirs)

    enc = encode_pairs(tokenizer, [PreferencePair(p, c, r, 0.0, None) for p, c, r in PAIRS], torch.device("cpu"))
    chosen, rejected = sequence_logps(model, enc)
    pairs = PairLogps(chosen, rejected, ref_chosen, ref_rejected, enc.severity, enc.gold)
    ours, _ = preference_objectives.get("dpo")(pairs, SimpleNamespace(beta=BETA), {})
    our_grad = grads(model, ours)
    loss_diff, grad_diff = abs(float(ours) - float(theirs)), float((our_grad - their_grad).abs().max())
    print(f"PARITY dpo: |loss diff| = {loss_diff:.3e}, max |grad diff| = {grad_diff:.3e}")
    assert loss_diff < 1e-6
    assert grad_diff < 1e-6
    assert float(their_grad.abs().max()) > 1e-4, "a vacuous comparison: no gradient"
