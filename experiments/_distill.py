"""Shared pieces of the distillation claim experiments: RL-made teachers, SFT on custom example mixes,
frozen loading, and the per-arm summary rows."""

from __future__ import annotations

import hashlib
import json

import _common as C
from posttrain import resolve
from posttrain.models import build_tiny, load_pretrained, save_pretrained, train_char_tokenizer
from posttrain.models.teacher import freeze
from posttrain.runtime import seed_everything
from posttrain.trainers.sft import train_sft


def rl_checkpoint(cfg, task, train, held, start, seed: int, steps: int, tag: str):
    """GRPO for `steps` from `start`, saved once per config (a teacher made by RL); returns (path, held-out)."""
    rl_cfg = resolve.updated(cfg.rl, "rl", **{"steps": steps, "advantage": "grpo", "loss": "clip", "aux": ()})
    key = hashlib.sha256(json.dumps([str(start), steps, tag, cfg.rl.model_dump(mode="json")], sort_keys=True).encode()).hexdigest()[:12]
    path = C.CACHE / f"{tag}_{key}_s{seed}"
    if not (path / "done").exists():
        model_holder = {}
        C.run_arm(cfg, rl_cfg, task, train, held, start, seed, on_step=lambda s, r: model_holder.setdefault("m", r), evaluate_fn=lambda m, t: save_pretrained(m, t, path) or {})
        (path / "done").write_text("ok")
    model, tok = load_pretrained(path)
    return path, C.evaluate(model, tok, task, held, cfg.eval, seed)[0]


def sft_on(cfg, task, examples, seed: int, tag: str, steps: int | None = None, extra_chars: str = ""):
    """A tiny model trained from scratch on `examples` (cached by content); returns its path. `extra_chars` join
    the task's alphabet in the tokenizer (e.g. SIPO's context labels)."""
    sft = cfg.sft.model_copy(update={"steps": steps or cfg.sft.steps})
    extra = [extra_chars] if extra_chars else []  # (absent when empty: the caches made before it stay valid)
    key = hashlib.sha256(json.dumps([[e.prompt, e.completion] for e in examples] + [sft.model_dump(), cfg.model.model_dump(mode="json"), *extra]).encode()).hexdigest()[:12]
    path = C.CACHE / f"{tag}_{key}_s{seed}"
    if not (path / "done").exists():
        seed_everything(seed)
        tok = train_char_tokenizer([task.alphabet() + extra_chars])
        model = build_tiny(cfg.model, tok)
        train_sft(model, tok, list(examples), sft, seed, on_log=lambda s, m: None)
        save_pretrained(model, tok, path)
        (path / "done").write_text("ok")
    return path


def frozen(path):
    return freeze(load_pretrained(path)[0])


def summary_row(arm: str, result: dict, k: int) -> dict:
    return {"arm": arm, "train_acc_first": C.window_mean(result["_history"], "accuracy", True, k),
            "train_acc_last": C.window_mean(result["_history"], "accuracy", False, k),
            "heldout_greedy_after": result["heldout_after"].get("greedy_accuracy", float("nan")),
            "heldout_sampled_after": result["heldout_after"].get("sampled_accuracy", float("nan"))}


def finish(args, cfg, claim: str, arms: dict, rows: list[dict], text: str, extra: dict, t0: float) -> None:
    import time

    runs = {}
    if cfg.tracking.enabled:
        for a, r in arms.items():
            final = {**{f"heldout_{m}": v for m, v in r["heldout_after"].items()}, "train_accuracy_last": next(x["train_acc_last"] for x in rows if x["arm"] == a)}
            runs[a] = C.log_arm(r["_cfg"], f"{claim}/{a}", r["_history"], final, rows, text)
    for r in arms.values():
        r["train_accuracy_curve"] = C.curve(r.pop("_history"), "accuracy")
        r.pop("_cfg")
    results = {"claim": claim, "steps": args.steps, "arms": arms, "table": rows, "mlflow_runs": runs, **extra, "runtime_s": round(time.time() - t0, 1)}
    print(f"runtime {results['runtime_s']}s")
    C.write_json(args, results)
