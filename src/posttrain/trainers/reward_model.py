"""Training the `bt` reward model (rewards/bradley_terry.py scores with it): a Bradley-Terry value head fitted on
preference pairs (Bradley & Terry 1952; Ouyang et al. 2022, arXiv 2203.02155, eq. 1),

    L_BT = -log sigmoid( r(x, y_w) - r(x, y_l) )

The model is the SFT checkpoint with a fresh one-output head (`AutoModelForSequenceClassification`, which
pools the last non-padding token). With `reward_model.options.bt.sft_weight` = alpha > 0 the backbone also keeps
its language model: the loss is L_BT + alpha * NLL(y_w | x), the next-token loss of the chosen answers through the
SFT model's output projection on the same hidden states (the SFT regulariser of Yang et al. 2024, "Regularizing
Hidden States Enables Learning Generalizable Reward Model for LLMs", arXiv 2406.10216). Pairwise labels alone
teach a small reward model little of what makes an answer right; the language-model term makes its features solve
the task the preferences are about. The projection is not saved: the reward model stays a plain value head.

The `reward_model` stage's trainers are registered in `rewards.reward_models` by kind: `bt` here, `trm` in
trainers/trm.py. Each saves `<out_dir>/model`, which the RL reward of the same name reads.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Literal

import torch
from pydantic import Field
from torch import Tensor

from posttrain.config import Section
from posttrain.models.chat import PromptFormat, configure_prompts
from posttrain.models.tokenizer import check_vocabulary
from posttrain.rewards import reward_models
from posttrain.rewards.bradley_terry import POOLING_FILE, SCORE_CHUNK, encode_texts, hidden_states, pool, scores
from posttrain.runtime import progress
from posttrain.trainers.common import optimizer_and_schedule
from posttrain.trainers.loop import TrainLoop


class BTModelOptions(Section):  # reward_model.options.bt
    pooling: Literal["last", "response_sum"] = "response_sum"  # where the value head's outputs become r(x, y)
    sft_weight: float = Field(1.0, ge=0)  # alpha of the language-modelling loss on the chosen answers (0: plain BT)


def language_head(model, policy_dir: Path, device) -> Callable[[Tensor], Tensor]:
    """The SFT model's output projection over `model`'s backbone: its tied input embeddings, or (untied) a
    trainable copy of the checkpoint's lm_head, used only by the auxiliary loss and not saved."""
    from transformers import AutoModelForCausalLM

    embeddings = model.get_input_embeddings()
    if model.config.tie_word_embeddings:
        return lambda hidden: hidden @ embeddings.weight.T
    return AutoModelForCausalLM.from_pretrained(policy_dir, dtype=embeddings.weight.dtype).get_output_embeddings().to(device)


def chosen_nll(head, hidden: Tensor, ids: Tensor, response: Tensor) -> Tensor:
    """Mean next-token NLL of the response tokens (answer + EOS) under `head` over the backbone's states."""
    logits = head(hidden[:, :-1]).float()
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
    weights = response[:, 1:].float()
    return (nll * weights).sum() / weights.sum().clamp_min(1.0)


def train_bt(cfg, policy_dir: Path, train, heldout, out_dir: Path, seed: int, on_log: Callable[[int, dict[str, float]], None],
             loop: TrainLoop | None = None) -> dict[str, float]:
    """Fit a BT reward model on `train` pairs from the SFT model at `policy_dir`; save it to out_dir/model.

    `loop` (trainers/loop.py) guards each step and, in a stage, checkpoints and resumes; the metrics carry `nonfinite_steps`."""
    from transformers import AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    from posttrain.models import load_tokenizer, select_device
    from posttrain.models.precision import apply_precision

    rm_cfg, device = cfg.reward_model, select_device(cfg.pipeline.device)
    tokenizer = load_tokenizer(policy_dir)
    check_vocabulary(tokenizer, [t for p in [*train, *heldout] for t in (p.prompt, p.chosen, p.rejected)], "the preference data")
    prompt_format = PromptFormat(cfg.model.chat_template, cfg.model.system_prompt, cfg.model.max_prompt_tokens)
    configure_prompts(tokenizer, prompt_format)  # prompts as the policy reads them; saved with the weights for RL
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the fresh value head is expected: do not print transformers' "newly initialized" report
    try:
        model = AutoModelForSequenceClassification.from_pretrained(policy_dir, num_labels=1, dtype=getattr(torch, cfg.model.dtype)).to(device)
    finally:
        hf_logging.set_verbosity(level)
    apply_precision(model, cfg.model.autocast, cfg.model.gradient_checkpointing, device)

    def encode(pairs):  # rows 2i / 2i+1: chosen / rejected of pair i
        prompts = [p.prompt for p in pairs for _ in range(2)]
        return encode_texts(tokenizer, prompts, [t for p in pairs for t in (p.chosen, p.rejected)], device)

    options = rm_cfg.options_for("bt")
    pooling = options.pooling
    head = language_head(model, policy_dir, device) if options.sft_weight > 0 else None
    extra = list(head.parameters()) if isinstance(head, torch.nn.Module) else []
    ids, mask, response = encode(train)
    held_ids, held_mask, held_response = encode(heldout)
    severity = torch.tensor([p.severity for p in heldout])

    @torch.no_grad()
    def heldout_scores() -> Tensor:
        model.eval()
        r = torch.cat([scores(model, held_ids[s : s + SCORE_CHUNK], held_mask[s : s + SCORE_CHUNK], held_response[s : s + SCORE_CHUNK], pooling)
                       for s in range(0, len(held_ids), SCORE_CHUNK)])
        model.train()
        return r

    def heldout_metrics() -> dict[str, float]:
        r = heldout_scores()
        wins = (r[0::2] > r[1::2]).float().cpu()
        out = {"heldout_pair_accuracy": float(wins.mean()), "heldout_score_margin": float((r[0::2] - r[1::2]).mean())}
        for level in sorted(set(severity.tolist())):  # accuracy per severity tier: near misses are the hard pairs
            out[f"heldout_pair_accuracy_sev{level:.2f}"] = float(wins[severity == level].mean())
        return out

    before = {f"{k}_before": v for k, v in heldout_metrics().items() if k == "heldout_pair_accuracy"}
    params = [*model.parameters(), *extra]
    optimizer, schedule = optimizer_and_schedule(params, rm_cfg.lr, 0.0, rm_cfg.warmup_steps, rm_cfg.steps)
    generator = torch.Generator().manual_seed(seed)
    loop = loop or TrainLoop()
    parts = {"optimizer": optimizer, "schedule": schedule, "generator": generator}
    if isinstance(head, torch.nn.Module):  # an untied lm_head copy trains with the model but is not part of it
        parts["head"] = head
    start, _ = loop.restore(model, parts)
    model.train()
    bar = progress(rm_cfg.steps, "reward_model (bt)", initial=start)
    for step in range(start + 1, rm_cfg.steps + 1):
        picked = torch.randint(len(train), (min(rm_cfg.batch_size, len(train)),), generator=generator)
        rows = torch.stack([2 * picked, 2 * picked + 1], dim=1).flatten().to(device)
        batch_ids, batch_response = ids[rows], response[rows]
        hidden = hidden_states(model, batch_ids, mask[rows])
        r = pool(model, hidden, batch_response, pooling)
        bt_loss = -torch.nn.functional.logsigmoid(r[0::2] - r[1::2]).mean()
        loss = bt_loss if head is None else bt_loss + options.sft_weight * chosen_nll(head, hidden[0::2], batch_ids[0::2], batch_response[0::2])
        loss.backward()
        loop.optimizer_step(step, loss, params, optimizer, rm_cfg.max_grad_norm)
        schedule.step()
        bar.update()
        if step % rm_cfg.log_every == 0 or step == rm_cfg.steps:
            metrics = {"rm_loss": float(bt_loss.detach()), "rm_total_loss": float(loss.detach()), "rm_train_accuracy": float((r[0::2] > r[1::2]).float().mean()), **heldout_metrics()}
            on_log(step, metrics)
            bar.set_postfix(loss=f"{metrics['rm_loss']:.3f}", acc=f"{metrics['heldout_pair_accuracy']:.2f}")
        loop.checkpoint(step, rm_cfg.steps, model, parts)
    bar.close()
    model.save_pretrained(out_dir / "model")
    tokenizer.save_pretrained(out_dir / "model")
    r = heldout_scores()
    (out_dir / "model" / POOLING_FILE).write_text(json.dumps({"pooling": pooling, "range": [float(r.min()), float(r[0::2].max())],
                                                                 "prompt_format": asdict(prompt_format)}))
    return {**before, **heldout_metrics(), **loop.metrics()}


reward_models.register("bt", options=BTModelOptions)(train_bt)
