"""Supervised fine-tuning on (prompt, completion) pairs: next-token cross-entropy on completion tokens
(and the EOS that ends them) only; prompt tokens are context. Under torchrun each rank trains on its share of
every batch and the gradients are summed (trainers/distributed.py): the same update as one process."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from posttrain.config import SFTConfig
from posttrain.models.chat import encode_supervised
from posttrain.tasks import Example
from posttrain.trainers import distributed
from posttrain.runtime import progress
from posttrain.trainers.common import optimizer_and_schedule
from posttrain.trainers.loop import TrainLoop


def encode_pairs(tokenizer: PreTrainedTokenizerBase, examples: list[Example]) -> tuple[Tensor, Tensor, Tensor]:
    """Right-padded ids, attention mask and labels: prompt -> completion + end of turn, or an example's messages
    with loss on its assistant turns (models/chat.py: the chat template's, when the tokenizer has one)."""
    return encode_supervised(tokenizer, examples)


def train_sft(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    examples: list[Example],
    cfg: SFTConfig,
    seed: int,
    on_log: Callable[[int, dict[str, float]], None],
    loop: TrainLoop | None = None,
) -> dict[str, float]:
    """`cfg.steps` updates on batches drawn with replacement; `loop` (trainers/loop.py) guards each step and, in a
    stage, checkpoints and resumes. Returns the last logged metrics and `nonfinite_steps`."""
    loop = loop or TrainLoop()
    device = next(model.parameters()).device
    ids, mask, labels = (t.to(device) for t in encode_pairs(tokenizer, examples))
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer, schedule = optimizer_and_schedule(params, cfg.lr, cfg.weight_decay, cfg.warmup_steps, cfg.steps)
    generator = torch.Generator().manual_seed(seed)
    parts = {"optimizer": optimizer, "schedule": schedule, "generator": generator}
    start, saved = loop.restore(model, parts)
    model.train()
    metrics: dict[str, float] = saved.get("metrics", {})
    bar = progress(cfg.steps, "sft", initial=start)
    ctx = distributed.current()
    sharded = distributed.is_sharded(model)
    for step in range(start + 1, cfg.steps + 1):
        rows = torch.randint(len(examples), (min(cfg.batch_size, len(examples)),), generator=generator).to(device)
        loss_kwargs = {}
        if ctx.active:  # every rank drew the same batch; each takes its share, the token mean stays over the whole batch
            rows = distributed.shard(rows, ctx)
            loss_kwargs["num_items_in_batch"] = distributed.all_sum((labels[rows][:, 1:] != -100).sum(), ctx)
        out = model(input_ids=ids[rows], attention_mask=mask[rows], labels=labels[rows], **loss_kwargs)
        out.loss.backward()
        if not sharded:  # FSDP reduce-scatters the gradients itself (summed, trainers/distributed.py)
            distributed.reduce_gradients(model, average=False, ctx=ctx)  # sum of per-rank sums / global token count
        loop.optimizer_step(step, out.loss, params, optimizer, cfg.max_grad_norm)
        schedule.step()
        bar.update()
        if step % cfg.log_every == 0 or step == cfg.steps:
            with torch.no_grad():
                predicted = out.logits[:, :-1].argmax(-1)
                target = labels[rows][:, 1:]
                valid = target != -100
                token_acc = float((predicted[valid] == target[valid]).float().mean())
            loss = float(distributed.all_sum(out.loss.detach(), ctx)) if ctx.active else out.loss.item()
            metrics = {"sft_loss": loss, "sft_token_accuracy": token_acc, "lr": schedule.get_last_lr()[0]}
            on_log(step, metrics)
            bar.set_postfix(loss=f"{metrics['sft_loss']:.3f}")
        loop.checkpoint(step, cfg.steps, model, parts, {"metrics": metrics})
    bar.close()
    if not sharded:  # sharded: one model, no replicas to compare
        distributed.check_in_sync(model, ctx)
    return {**metrics, **loop.metrics()}
