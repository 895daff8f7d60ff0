"""CARE's rubric generator (Context-Adaptive Rubric Evolution, 2026): a tiny LM that reads a dialogue context (recipes/care/dialogue.py) and writes
context-adaptive weights `c=2,a=6,p=2` over the cognitive / affective / proactive dimensions.

Two phases, as in the paper's abstract: SFT on turn-level rubric labels, then preference RL on human preferences,
both simulated with known truth and known flaws by `RubricTask` (recipes/care/rubric.py). Preference RL is the online RL
loop (trainers/online_rl.py) with the `rl` section's objective (GRPO by default) on `RubricTask`, whose verifier is
the context's human preferences: the reward of a sampled rubric is q = 1[R_t(a_w) > R_t(a_l)] averaged over the
context's pairs (`correctness`), plus `care.format_weight` x (the rubric parses). Reported before and after
preference RL on held-out contexts: the weight error 0.5 |w - w*|_1, the pair accuracy (mean q against the true
order), the top-two agreement (the two heaviest dimensions, which decide the best reply) and the parse rate.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from posttrain.config import Config, RewardSpec, SFTConfig
from posttrain.recipes.care.rubric import RUBRIC_TOKENS, RubricTask, generate_rubrics, rubric_quality, weight_error
from posttrain.trainers.loop import TrainLoop


def train_rubric_generator(
    cfg: Config, out_dir: Path, on_log: Callable[[int, dict[str, float]], None], loop: TrainLoop | None = None
) -> tuple[dict[str, float], list[dict[str, float]], list[dict[str, object]]]:
    """SFT then preference RL of a tiny generator (sizes from `model`); saves it to out_dir/model. Returns
    (metrics, RL history, a table of held-out rubrics after training). `loop` (trainers/loop.py; in the stage
    `care.checkpoint_every` steps apart): SFT checkpoints into its directory, its last step included, so a resume
    after SFT restores the SFT model (the RL reference, the `*_sft` metrics) and runs no SFT step again; RL into
    <directory>/rl. `nonfinite_steps` counts the skipped steps of both phases."""
    from posttrain.models import build_tiny, save_pretrained, select_device, train_char_tokenizer
    from posttrain.runtime import seed_everything
    from posttrain.trainers.online_rl import RLRun
    from posttrain.trainers.rl import train_online_rl
    from posttrain.trainers.sft import train_sft

    c, seed, loop = cfg.care, cfg.pipeline.seed, loop or TrainLoop()
    task = RubricTask(c)
    data = task.splits(seed)
    seed_everything(seed)
    tokenizer = train_char_tokenizer([task.alphabet()])
    model = build_tiny(cfg.model, tokenizer).to(select_device(cfg.pipeline.device))
    sft_cfg = SFTConfig(steps=c.sft_steps, batch_size=c.batch_size, lr=c.sft_lr, warmup_steps=c.warmup_steps, weight_decay=0.0,
                        max_grad_norm=c.max_grad_norm, n_examples=0, log_every=c.log_every,
                        checkpoint_every=c.checkpoint_every)
    sft = train_sft(model, tokenizer, data["sft"], sft_cfg, seed, loop=loop.phase(save_last=True),
                    on_log=lambda step, m: on_log(step, {f"sft/{k}": v for k, v in m.items()}))
    held = data["heldout"]
    metrics = {"weight_error_labels": sum(weight_error(e.completion, e.prompt) for e in data["sft"]) / len(data["sft"])}
    metrics |= {f"{k}_uniform": v for k, v in rubric_quality([""] * len(held), held).items() if k in ("weight_error", "pair_accuracy")}
    metrics |= {f"{k}_sft": v for k, v in rubric_quality(generate_rubrics(model, tokenizer, [e.prompt for e in held]), held).items()}
    rewards = (RewardSpec(name="correctness", weight=1.0), RewardSpec(name="format", weight=c.format_weight))
    rl_cfg = cfg.rl.model_copy(update={
        "rewards": rewards, "steps": c.rl_steps, "prompts_per_step": c.rl_prompts_per_step, "group_size": c.rl_group_size,
        "max_new_tokens": RUBRIC_TOKENS, "lr": c.rl_lr, "warmup_steps": 0, "checkpoint_every": loop.every, "log_every": c.log_every,
    })
    rl_dir = loop.phase("rl").checkpoint_dir
    run = RLRun(policy=model, tokenizer=tokenizer, task=task, examples=data["train"], cfg=rl_cfg, seed=seed,
                checkpoint_dir=rl_dir or Path("unused-checkpoints"), config_hash=loop.config_hash,
                max_nonfinite_steps=loop.max_nonfinite_steps, keep_checkpoints=loop.keep, checkpoint_section="care")
    history, _ = train_online_rl(run, loop.resume, on_log=lambda step, m: on_log(c.sft_steps + step, {f"rl/{k}": v for k, v in m.items()}))
    after = generate_rubrics(model, tokenizer, [e.prompt for e in held])
    metrics |= rubric_quality(after, held)
    metrics["nonfinite_steps"] = sft["nonfinite_steps"] + history[-1]["nonfinite_steps"]
    save_pretrained(model, tokenizer, out_dir / "model")
    table = [{"context": e.prompt, "rubric": text, "true_rubric": e.completion} for e, text in list(zip(held, after))[:50]]
    return metrics, history, table
