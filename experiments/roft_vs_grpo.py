"""Claim (ROFT, Retrospection-Only Fine-Tuning): training only on the policy's own retrospections of its attempts
(next-token loss on the retrospection tokens; no reward in the update, no teacher) improves held-out accuracy as
much as GRPO at the same number of updates and sampled attempts (the abstract: ROFT after 20 updates vs GRPO
after 40).

Setting: 2-digit addition (params.yaml's task). A from-scratch character model cannot read a retrospection prompt
it never saw, so the start model is SFT'd on the plain examples plus each example twice behind ROFT's retrospection
prompt (`<attempt>-<outcome>=<prompt>` -> the reference): after the right attempt with outcome `=`, and after a
wrong attempt with outcome `-`. The wrong attempts are a weaker model's own (the plain examples SFT'd for half the
steps, sampled as RL samples), a near miss where it never failed the example: synthetic near misses alone taught the
start to ignore the attempt (it answered afresh after either outcome, so its retrospections repeated the attempts'
accuracy: lead 0.024 / 0.028 / -0.002 at 1,000 SFT steps). The SFT data never holds a retrospection of an attempt
the RL policy made: what ROFT trains on is sampled on-policy during RL. Arms from that start:
`grpo` (preset grpo) and `roft` (preset roft), with the same steps, prompts per step, group size and lr, so the
same updates and the same attempts (ROFT also samples one retrospection per attempt).

ROFT's premise, measured on its own batches: its retrospections are a different signal from the attempts they
explain. Reported per arm: held-out greedy accuracy before and after, train accuracy (first/last fifth); for
ROFT the verifier's accuracy of the retrospections read as answers, the attempts' accuracy, the retrospections'
accuracy after a failed attempt and the share of retrospections that repeat the attempt.

    .venv/bin/python experiments/roft_vs_grpo.py [--steps N] [--json FILE] [--micro] [--set rl.options.roft.temperature=0.7]
"""

from __future__ import annotations

import random
import time

import torch

import _common as C
import _distill as D
from posttrain import resolve
from ppo_vs_grpo import resolve_preset
from posttrain.rollout.sampling import generate
from posttrain.tasks import Example, build_task
from posttrain.trainers import contexts
from posttrain.trainers.extras import row_examples, success

ARMS = ("grpo", "roft")
NEAR_MISSES = (-10, -2, -1, 1, 2, 10)


def own_failures(cfg, task, plain: list[Example], seed: int, extra_chars: str) -> list[list[str]]:
    """Per plain example, the distinct wrong attempts of a weaker model of the same kind (SFT'd on the plain examples
    for half the start's steps), sampled as RL samples attempts (rl.group_size at rl.temperature): the failures an
    RL attempt actually shows, rather than synthetic near misses."""
    path = D.sft_on(cfg, task, plain, seed, "roft_attempts", steps=max(1, cfg.sft.steps // 2), extra_chars=extra_chars)
    model, tok = C.load_pretrained(path)
    model.eval()
    g = cfg.rl.group_size
    out, texts = generate(model, tok, [e.prompt for e in plain], cfg.rl.max_new_tokens, group_size=g,
                          temperature=cfg.rl.temperature, generator=torch.Generator().manual_seed(seed), chunk=256)
    finished = out.finished.tolist()
    wrong: list[list[str]] = [[] for _ in plain]
    for i, text in enumerate(texts):
        e = plain[i // g]
        if task.correctness_reward(text, finished[i], e) < 1.0 and text not in wrong[i // g]:
            wrong[i // g].append(text)
    return wrong


def retrospection_examples(examples: list[Example], seed: int, failures: list[list[str]] | None = None) -> list[Example]:
    """Each example behind ROFT's retrospection prompt twice, its reference the target both times: after the right
    attempt (outcome ok) and after a failed one (outcome failed): one of `failures[i]` (a model's own wrong attempts
    at the example) where it has any, else a near miss (+-1, 2, 10). The pair differs only in the attempt and its
    outcome, so the start learns to read them: copy a right attempt, answer afresh after a failed one."""
    rng = random.Random(seed)
    out = []
    for i, e in enumerate(examples):
        own = failures[i] if failures else []
        wrong = rng.choice(own) if own else str(abs(int(e.answer) + rng.choice(NEAR_MISSES)))
        if wrong == e.completion:  # |answer - d| can land back on the answer
            wrong = str(int(e.answer) + 1)
        for attempt, feedback in ((e.completion, contexts.OUTCOME_OK), (wrong, contexts.OUTCOME_FAILED)):
            out.append(Example(prompt=contexts.retrospection_prompt(e, attempt, feedback), completion=e.completion, answer=e.answer))
    return out


def retrospection_stats(tokenizer, task, result) -> dict[str, float]:
    """One ROFT batch: its retrospections read as answers to the task, against the attempts they explain."""
    batch = result.batch
    retro = batch.extras["retrospections"]
    ids = retro[:, 0].masked_fill(retro[:, 2] == 0, tokenizer.pad_token_id)
    texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
    examples, ok = row_examples(result.prompts, batch), success(batch).tolist()
    right = [task.correctness_reward(t, True, e) >= 1.0 for t, e in zip(texts, examples)]
    failed = [r for r, s in zip(right, ok) if not s]
    return {"attempt_acc": sum(ok) / len(ok), "retro_acc": sum(right) / len(right),
            "retro_acc_after_fail": sum(failed) / len(failed) if failed else float("nan"), "failed_attempts": len(failed),
            "retro_repeats_attempt": sum(t == a for t, a in zip(texts, result.texts)) / len(texts)}


def mean(values: list[float]) -> float:
    finite = [v for v in values if v == v]
    return sum(finite) / len(finite) if finite else float("nan")


def main() -> None:
    args = C.parse_args(__doc__.split("\n")[0], 100)
    t0 = time.time()
    cfg = C.load_config(args, [])
    task = build_task(cfg.task)
    splits = task.splits(args.seed)
    train, held = splits["train"], splits["heldout"]
    plain = train[: cfg.sft.n_examples or None]
    chars = contexts.LABEL_CHARS + contexts.OUTCOME_OK + contexts.OUTCOME_FAILED
    failures = own_failures(cfg, task, plain, args.seed, chars)
    own_share = sum(bool(f) for f in failures) / len(failures)
    print(f"weaker model's own wrong attempts on {own_share:.3f} of the SFT examples", flush=True)
    path = D.sft_on(cfg, task, plain + retrospection_examples(plain, args.seed, failures), args.seed, "roft_sft", extra_chars=chars)
    model, tok = C.load_pretrained(path)
    sft = C.evaluate(model, tok, task, held, cfg.eval, args.seed)[0]
    print(f"SFT (plain + retrospection format) held-out greedy {sft['greedy_accuracy']:.4f}", flush=True)
    k = max(1, args.steps // 5)
    arms, rows, signal = {}, [], []
    for arm in ARMS:
        rl_cfg = resolve.updated(cfg.rl, "rl", preset=arm, **resolve_preset(cfg, arm))
        on_step = (lambda step, result: signal.append(retrospection_stats(tok, task, result))) if arm == "roft" else None
        history, after, seconds = C.run_arm(cfg, rl_cfg, task, train, held, path, args.seed, on_step=on_step)
        arms[arm] = {"heldout_after": after, "rl_seconds": round(seconds, 1), "_history": history, "_cfg": cfg.model_copy(update={"rl": rl_cfg})}
        rows.append({**D.summary_row(arm, arms[arm], k), "heldout_greedy_before": sft["greedy_accuracy"], "rl_seconds": round(seconds, 1)})
        print(f"{arm}: {seconds:.0f}s, held-out greedy {sft['greedy_accuracy']:.4f} -> {after['greedy_accuracy']:.4f}", flush=True)
    first, last = signal[:k], signal[-k:]
    retro = {f"{key}_{part}": mean([s[key] for s in steps]) for part, steps in (("first", first), ("last", last))
             for key in ("attempt_acc", "retro_acc", "retro_acc_after_fail", "retro_repeats_attempt")}
    retro["lead_first"] = retro["retro_acc_first"] - retro["attempt_acc_first"]
    arms["roft"]["retrospections"] = retro
    text = C.print_table(f"\nROFT vs GRPO on 2-digit addition, {args.steps} updates each (first/last {k} steps)", rows)
    print("ROFT's retrospections: " + ", ".join(f"{key} {v:.3f}" for key, v in retro.items()), flush=True)
    D.finish(args, cfg, "roft_vs_grpo", arms, rows, text, {"sft_heldout": sft, "k": k, "sft_steps": cfg.sft.steps, "own_failure_share": own_share}, t0)


if __name__ == "__main__":
    C.run_seeds(main, "roft_vs_grpo")
