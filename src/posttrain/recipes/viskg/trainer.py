"""VisKG's two loops (specs §29) over a vision-language model (recipes/viskg/vlm.py's `VisionLanguage`: the tiny patch-encoder
model, or a native image-text-to-text checkpoint loaded by path) and the VQA set of recipes/viskg/data.py.

1. `train_sft`: NLL on every target token of (image, question) -> representation -> reasoning -> answer, the
   positives mixed with negative-rationale samples (`viskg.sft.negatives_per_positive`; each ends with the correct
   answer, so the model is never taught a wrong one).
2. `train_rl`: the core RL step (trainers/online_rl.py's `OnlineRL.step`) over the model as a `Policy`
   (recipes/viskg/policy.py): per step `prompts_per_step` training questions, `group_size` samples each at
   `temperature` with their log-probs recorded; the reward matrix [B, 3] = (r_acc, r_fmt, r_kg) of
   recipes/viskg/rewards.py (registered as viskg_accuracy, viskg_format, viskg_compactness, weighted by
   viskg.rl.weights); the registered estimator (`viskg.rl.advantage`: gdpo normalises each reward in its group, grpo
   their weighted sum) and policy loss (`viskg.rl.loss`), with the core's dynamic sampling, off-policy correction,
   epochs per batch, cosine schedule and diagnostics. A step's questions are drawn from (seed, step) and the sampling
   generator is checkpointed: a resumed run draws the same.

`evaluate` decodes held-out questions greedily: accuracy (overall and by hops), format rate, completion and
representation tokens, and the reference graph vs caption token counts of the same images (the graph is shorter).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from posttrain.recipes.viskg import data as D
from posttrain.recipes.viskg.vlm import VisionLanguage, VisionLanguageModel, load_vlm
from posttrain.config import RLConfig
from posttrain.recipes.viskg.policy import VisionLanguagePolicy, VisKGTask, decode
from posttrain.recipes.viskg.rewards import REWARD_NAMES, parse_output, reward_row
from posttrain.tasks import Example
from posttrain.trainers.loop import NumpyDraws, TrainLoop
from posttrain.trainers.online_rl import OnlineRL, RLRun, rl_of_section


def build_model(cfg, seed: int) -> VisionLanguage:
    """The model of `viskg.model`: a saved vision-language model (a VisionLanguageModel directory or a native
    image-text-to-text checkpoint), a causal LM with a fresh patch encoder, or a tiny one."""
    m, d = cfg.model, cfg.data
    torch.manual_seed(seed)
    if m.path:
        return load_vlm(m.path)
    if m.language_model:
        return VisionLanguageModel.around(m.language_model, d.grid * d.cell, d.cell)
    return VisionLanguageModel.tiny(D.vocabulary(), d.grid * d.cell, d.cell, m.hidden_size, m.layers, m.heads)


def split(cfg, seed: int, heldout: bool) -> tuple[list[D.Question], torch.Tensor]:
    d = cfg.data
    qs = D.questions(seed, d.n_heldout if heldout else d.n_train, d.grid, d.n_objects, d.max_hops, split=int(heldout))
    return qs, torch.from_numpy(D.render_all(qs, d.cell))


def encode_prompts(vlm: VisionLanguage, qs: list[D.Question], images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return vlm.encode_prompts([q.text for q in qs], images)


def encode_completions(tokenizer, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded completion ids, EOS appended, and their mask."""
    rows = [tokenizer(t, add_special_tokens=False).input_ids + [tokenizer.eos_token_id] for t in texts]
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)], mask[i, : len(r)] = torch.tensor(r), 1
    return ids, mask


def token_counter(tokenizer) -> Callable[[str], int]:
    return lambda text: len(tokenizer(text, add_special_tokens=False).input_ids)


# -- 1. SFT with negative rationales -------------------------------------------------------------------------
def train_sft(cfg, vlm: VisionLanguage, seed: int, loop: TrainLoop | None = None, on_log=None) -> tuple[list[dict], dict]:
    """(history, figures) of SFT on the training questions (cfg: the viskg section)."""
    s = cfg.sft
    qs, images = split(cfg, seed, heldout=False)
    examples = D.sft_examples(qs, cfg.representation, s.negatives_per_positive, seed)
    optimizer = torch.optim.AdamW(vlm.parameters(), lr=s.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: min(1.0, (k + 1) / (s.warmup_steps + 1)))
    loop, rng = loop or TrainLoop(), np.random.default_rng([seed, 29, 11])
    parts = {"optimizer": optimizer, "schedule": schedule, "draw": NumpyDraws(rng)}
    start, saved = loop.restore(vlm, parts)
    history: list[dict] = saved.get("history", [])
    vlm.train()
    for step in range(start + 1, s.steps + 1):
        chosen = [examples[i] for i in rng.choice(len(examples), size=min(s.batch_size, len(examples)), replace=False)]
        batch_images = images[[i for i, _ in chosen]]
        prompt_ids, prompt_mask = encode_prompts(vlm, [qs[i] for i, _ in chosen], batch_images)
        ids, mask = encode_completions(vlm.tokenizer, [t for _, t in chosen])
        logp = vlm.completion_logp(batch_images, prompt_ids, prompt_mask, ids, mask)
        loss = -logp.sum() / mask.sum()
        loss.backward()
        grad_norm = loop.optimizer_step(step, loss, list(vlm.parameters()), optimizer, s.max_grad_norm)
        schedule.step()
        if step % s.log_every == 0 or step == s.steps:
            history.append({"step": step, "loss": float(loss.detach()), "grad_norm": grad_norm,
                            "negative_share": sum("incorrect reasoning" in t for _, t in chosen) / len(chosen)})
            if on_log:
                on_log(step, history[-1])
        loop.checkpoint(step, s.steps, vlm, parts, {"history": history})
    n_neg = len(examples) - len(qs)
    return history, {"sft_loss": history[-1]["loss"], "sft_examples": float(len(examples)), "sft_negatives": float(n_neg), **loop.metrics()}


# -- 2. RL: GDPO (or GRPO) over accuracy, format and compactness, through the core RL step ------------------------
def rl_settings(r) -> RLConfig:
    """The rl settings of the core step for the `viskg.rl` section: its keys shared with `rl`, its three rewards with
    their weights, a constant learning rate (as the recipe's own loop had) without warm-up, no reference model (the
    rewards are registered by recipes/viskg/policy.py)."""
    weights = {"accuracy": r.weights.accuracy, "format": r.weights.format, "compactness": r.weights.compactness}
    rewards = tuple({"name": f"viskg_{n}", "weight": weights[n]} for n in REWARD_NAMES)
    return rl_of_section(r, rewards=rewards, warmup_steps=0, lr_schedule="constant", beta=0.0)


def rl_trainer(cfg, vlm: VisionLanguage, seed: int, loop: TrainLoop | None = None) -> tuple[OnlineRL, list[Example]]:
    """The core RL trainer over `vlm` (its `VisionLanguagePolicy`) and the training questions as examples, each with its image."""
    qs, images = split(cfg, seed, heldout=False)
    examples = [Example(prompt=q.text, completion="", answer=q.answer, metadata={"image": images[i], "hops": q.hops}) for i, q in enumerate(qs)]
    loop = loop or TrainLoop()
    task = VisKGTask(cfg.representation, cfg.rl.kg_budget, token_counter(vlm.tokenizer))
    run = RLRun(policy=vlm, tokenizer=vlm.tokenizer, task=task, examples=examples, cfg=rl_settings(cfg.rl), seed=seed,
                checkpoint_dir=loop.checkpoint_dir, config_hash=loop.config_hash, adapter=VisionLanguagePolicy(vlm))
    return OnlineRL(run, loop=loop), examples


def nonconstant_share(column: torch.Tensor, group: torch.Tensor) -> float:
    """Share of groups in which a reward column varies (the groups that give it a non-zero advantage)."""
    return float(np.mean([float(column[group == g].std() > 0) for g in group.unique()]))


def rl_step(cfg, trainer: OnlineRL, examples: list[Example], seed: int, step: int) -> dict[str, float]:
    """One update of the core step on `prompts_per_step` questions drawn from (seed, step) (dynamic sampling's refills
    from the same draw), so a resumed run draws the same; the core's figures plus VisKG's own per reward."""
    r = cfg.rl
    rng = np.random.default_rng([seed, 29, 13, step])
    draw = lambda n: [examples[i] for i in rng.choice(len(examples), size=min(n, len(examples)), replace=False)]  # noqa: E731
    result = trainer.step(draw(r.prompts_per_step), more_prompts=draw)
    batch = result.batch
    out = {f"reward_{name}": float(batch.rewards[:, k].mean()) for k, name in enumerate(REWARD_NAMES)}
    out |= {f"varied_{name}": nonconstant_share(batch.rewards[:, k], batch.group) for k, name in enumerate(REWARD_NAMES)}
    return {"step": step, **result.metrics, "advantage_abs": result.metrics["advantage_abs_mean"],
            "completion_tokens": float(batch.completion_mask.sum(1).float().mean()), **out}


def train_rl(cfg, vlm: VisionLanguage, seed: int, loop: TrainLoop | None = None, on_log=None) -> list[dict]:
    r, loop = cfg.rl, loop or TrainLoop()
    trainer, examples = rl_trainer(cfg, vlm, seed, loop)
    parts = {"trainer": trainer}
    start, saved = loop.restore(vlm, parts)
    history: list[dict] = saved.get("history", [])
    vlm.train()
    for step in range(start + 1, r.steps + 1):
        row = rl_step(cfg, trainer, examples, seed, step)
        history.append(row)
        if on_log and (step % r.log_every == 0 or step == r.steps):
            on_log(step, row)
        loop.checkpoint(step, r.steps, vlm, parts, {"history": history})
    return history


# -- evaluation ----------------------------------------------------------------------------------------------
def evaluate(cfg, vlm: VisionLanguage, seed: int) -> tuple[dict[str, float], list[dict], list[D.Question], torch.Tensor]:
    """(figures, per-question rows, the held-out questions, their images) of greedy decoding."""
    e = cfg.eval
    qs, images = split(cfg, seed, heldout=True)
    count = token_counter(vlm.tokenizer)
    vlm.eval()
    rows = []
    for lo in range(0, len(qs), e.batch_size):
        part = qs[lo: lo + e.batch_size]
        prompt_ids, prompt_mask = encode_prompts(vlm, part, images[lo: lo + e.batch_size])
        ids, mask = vlm.generate(images[lo: lo + e.batch_size], prompt_ids, prompt_mask, e.max_new_tokens, 0.0)
        for q, text, n in zip(part, decode(vlm.tokenizer, ids, mask), mask.sum(1).tolist()):
            acc, fmt, kg = reward_row(text, q.answer, cfg.representation, cfg.rl.kg_budget, count)
            parsed = parse_output(text)
            rows.append({"question": q.text, "answer": q.answer, "hops": q.hops, "output": text, "accuracy": acc, "format": fmt,
                         "compactness": kg, "tokens": int(n), "graph_tokens": count(parsed.graph_text) if parsed.tag else 0})
    mean = lambda key, rs=rows: float(np.mean([x[key] for x in rs])) if rs else float("nan")  # noqa: E731
    figures = {"accuracy": mean("accuracy"), "format_rate": mean("format"), "compactness": mean("compactness"), "tokens": mean("tokens"),
               "graph_tokens": mean("graph_tokens"),
               "reference_kg_tokens": float(np.mean([count(D.knowledge_graph(q)) for q in qs])),
               "reference_caption_tokens": float(np.mean([count(D.caption(q)) for q in qs]))}
    for h in range(1, cfg.data.max_hops + 1):
        figures[f"accuracy_hops{h}"] = mean("accuracy", [x for x in rows if x["hops"] == h])
    return figures, rows, qs, images
