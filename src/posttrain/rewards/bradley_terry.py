"""`bt`: a Bradley-Terry scalar reward model (Bradley & Terry 1952; the RLHF reward model of Ouyang et al.
2022, "Training language models to follow instructions with human feedback", arXiv 2203.02155, eq. 1).

A value head on the language model reads the hidden state of the last token of `prompt + response + EOS`
and returns a scalar r(x, y); pairs train it by maximising the likelihood that the chosen response wins:

    L_BT = -log sigmoid( r(x, y_w) - r(x, y_l) )

The model is the SFT checkpoint with a fresh one-output head (`AutoModelForSequenceClassification`, which
pools the last non-padding token). With `reward_model.options.bt.sft_weight` = alpha > 0 the backbone also keeps
its language model: the loss is L_BT + alpha * NLL(y_w | x), the next-token loss of the chosen answers through the
SFT model's output projection on the same hidden states (the SFT regulariser of Yang et al. 2024, "Regularizing
Hidden States Enables Learning Generalizable Reward Model for LLMs", arXiv 2406.10216). Pairwise labels alone
teach a small reward model little of what makes an answer right; the language-model term makes its features solve
the task the preferences are about. The projection is not saved: the reward model stays a plain value head.

As an RL reward (`rl.rewards: [{name: bt}]`) it scores each completion with r(x, y); only differences within a
group matter to group-normalised estimators. With `clip`, r is clamped to the range the model gave the held-out
pairs (lowest candidate to highest preferred answer, saved with the weights): a completion the model scores above
every real preferred answer earns no more than the best of them, which takes away the payoff of out-of-distribution
outputs a learned reward over-rates (reward hacking).
Settings: rl.options.bt.path, the `reward_model` stage's output directory; rl.options.bt.clip.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

import torch
from pydantic import Field
from torch import Tensor

from posttrain.config import Section
from posttrain.errors import UserError
from posttrain.rewards import reward_models, rewards
from posttrain.models.decoders import positions_from_mask

SCORE_CHUNK = 512
POOLING_FILE = "bt_pooling.json"  # saved next to the weights: how the reward reads r(x, y), and its held-out range


class BTOptions(Section):  # rl.options.bt
    path: str  # the reward_model stage's output directory (holding model/)
    clip: bool  # clamp r(x, y) to its range on the held-out pairs


class BTModelOptions(Section):  # reward_model.options.bt
    pooling: Literal["last", "response_sum"]  # where the value head's outputs become r(x, y)
    sft_weight: float = Field(ge=0)  # alpha of the language-modelling loss on the chosen answers (0: plain BT)


def encode_texts(tokenizer, prompts: Sequence[str], responses: Sequence[str], device) -> tuple[Tensor, Tensor, Tensor]:
    """Left-padded ids, attention mask and response mask (response tokens + EOS) of `prompt + response + EOS`
    (an unfinished response is judged as the text it is, the way pairs present it in training)."""
    heads = [tokenizer.encode(p, add_special_tokens=False) for p in prompts]
    tails = [tokenizer.encode(r, add_special_tokens=False) + [tokenizer.eos_token_id] for r in responses]
    width = max(len(h) + len(t) for h, t in zip(heads, tails))
    ids = torch.full((len(heads), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(heads), width), dtype=torch.long)
    response = torch.zeros((len(heads), width), dtype=torch.long)
    for i, (head, tail) in enumerate(zip(heads, tails)):
        ids[i, width - len(head) - len(tail) :] = torch.tensor(head + tail)
        mask[i, width - len(head) - len(tail) :] = 1
        response[i, width - len(tail) :] = 1
    return ids.to(device), mask.to(device), response.to(device)


def hidden_states(model, ids: Tensor, mask: Tensor) -> Tensor:
    """The backbone's last hidden states [N, T, H] (left padding: positions count from each row's first token)."""
    return model.base_model(input_ids=ids, attention_mask=mask, position_ids=positions_from_mask(mask)).last_hidden_state


def pool(model, hidden: Tensor, response: Tensor, pooling: str) -> Tensor:
    """r(x, y) [N]: the value head at the last token (`last`), or summed over the response tokens
    (`response_sum`: each token's value judges the text up to it, a token-level decomposition of r)."""
    values = model.score(hidden).squeeze(-1).float()
    return values[:, -1] if pooling == "last" else (values * response).sum(-1)


def scores(model, ids: Tensor, mask: Tensor, response: Tensor, pooling: str) -> Tensor:
    return pool(model, hidden_states(model, ids, mask), response, pooling)


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


def train_bt(cfg, policy_dir: Path, train, heldout, out_dir: Path, seed: int, on_log: Callable[[int, dict[str, float]], None]) -> dict[str, float]:
    """Fit a BT reward model on `train` pairs from the SFT model at `policy_dir`; save it to out_dir/model."""
    from transformers import AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    from posttrain.models import load_tokenizer, select_device
    from posttrain.trainers.common import optimizer_and_schedule, optimizer_step, progress
    from posttrain.trainers.preference import check_vocabulary

    rm_cfg, device = cfg.reward_model, select_device(cfg.pipeline.device)
    tokenizer = load_tokenizer(policy_dir)
    check_vocabulary(tokenizer, [t for p in [*train, *heldout] for t in (p.prompt, p.chosen, p.rejected)], "the preference data")
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the fresh value head is expected: do not print transformers' "newly initialized" report
    try:
        model = AutoModelForSequenceClassification.from_pretrained(policy_dir, num_labels=1, dtype=getattr(torch, cfg.model.dtype)).to(device)
    finally:
        hf_logging.set_verbosity(level)

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
    model.train()
    bar = progress(rm_cfg.steps, "reward_model (bt)")
    for step in range(1, rm_cfg.steps + 1):
        picked = torch.randint(len(train), (min(rm_cfg.batch_size, len(train)),), generator=generator)
        rows = torch.stack([2 * picked, 2 * picked + 1], dim=1).flatten().to(device)
        batch_ids, batch_response = ids[rows], response[rows]
        hidden = hidden_states(model, batch_ids, mask[rows])
        r = pool(model, hidden, batch_response, pooling)
        bt_loss = -torch.nn.functional.logsigmoid(r[0::2] - r[1::2]).mean()
        loss = bt_loss if head is None else bt_loss + options.sft_weight * chosen_nll(head, hidden[0::2], batch_ids[0::2], batch_response[0::2])
        loss.backward()
        optimizer_step(params, optimizer, rm_cfg.max_grad_norm)
        schedule.step()
        bar.update()
        if step % rm_cfg.log_every == 0 or step == rm_cfg.steps:
            metrics = {"rm_loss": float(bt_loss.detach()), "rm_total_loss": float(loss.detach()), "rm_train_accuracy": float((r[0::2] > r[1::2]).float().mean()), **heldout_metrics()}
            on_log(step, metrics)
            bar.set_postfix(loss=f"{metrics['rm_loss']:.3f}", acc=f"{metrics['heldout_pair_accuracy']:.2f}")
    bar.close()
    model.save_pretrained(out_dir / "model")
    tokenizer.save_pretrained(out_dir / "model")
    r = heldout_scores()
    (out_dir / "model" / POOLING_FILE).write_text(json.dumps({"pooling": pooling, "range": [float(r.min()), float(r[0::2].max())]}))
    return {**before, **heldout_metrics()}


reward_models.register("bt", options=BTModelOptions)(train_bt)


@functools.lru_cache(maxsize=4)
def _load(path: str, stamp: float):
    from transformers import AutoModelForSequenceClassification

    from posttrain.models import load_tokenizer, select_device

    model = AutoModelForSequenceClassification.from_pretrained(path).to(select_device("auto")).eval().requires_grad_(False)
    tokenizer = load_tokenizer(path)
    return model, tokenizer, json.loads((Path(path) / POOLING_FILE).read_text())


def load_reward_model(directory: str, kind: str):
    """(model, tokenizer, {"pooling", "range"}) under `directory/model` (cached while unchanged); UserError if absent."""
    path = Path(directory) / "model"
    if not (path / "config.json").is_file() or not (path / POOLING_FILE).is_file():
        raise UserError(f"rl.options.{kind}.path: no trained reward model at {path} (run the reward_model stage with reward_model.kind={kind})")
    return _load(str(path.resolve()), (path / "config.json").stat().st_mtime)


@rewards.register("bt", needs=("rl",), options=BTOptions)
@torch.no_grad()
def bt_reward(task, examples, completions, finished, *, rl) -> Tensor:
    """r(x, y) of the Bradley-Terry model trained by the reward_model stage (clamped to its held-out range with clip)."""
    options = rl.options_for("bt")
    model, tokenizer, settings = load_reward_model(options.path, "bt")
    pooling = settings["pooling"]
    device = next(model.parameters()).device
    out = []
    for s in range(0, len(completions), SCORE_CHUNK):
        ids, mask, response = encode_texts(tokenizer, [e.prompt for e in examples[s : s + SCORE_CHUNK]], completions[s : s + SCORE_CHUNK], device)
        out.append(scores(model, ids, mask, response, pooling).cpu())
    r = torch.cat(out)
    return r.clamp(*settings["range"]) if options.clip else r
