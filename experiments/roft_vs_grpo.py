"""Claim (ROFT, Retrospection-Only Fine-Tuning): training only on the policy's own retrospections of its attempts
(next-token loss on the retrospection tokens; no reward in the update, no teacher) improves held-out accuracy as
much as GRPO at the same number of updates and sampled attempts (the abstract: ROFT after 20 updates vs GRPO
after 40).

Setting: 2-digit addition (params.yaml's task). A from-scratch character model cannot read a retrospection prompt
it never saw, so the start model is SFT'd on the plain examples plus each example behind ROFT's retrospection
prompt (`<attempt>-<outcome>=<prompt>` -> the reference; the attempt right with outcome `=` half the time, a
near-miss with outcome `-` otherwise), as sipo_vs_grpo.py teaches SIPO's context. The SFT data never holds an RL
prompt's retrospection of an RL attempt: what ROFT trains on is sampled on-policy during RL. Arms from that start:
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

import _common as C
import _distill as D
from posttrain import resolve
from ppo_vs_grpo import resolve_preset
from posttrain.tasks import Example, build_task
from posttrain.trainers import contexts
from posttrain.trainers.extras import row_examples, success

ARMS = ("grpo", "roft")
NEAR_MISSES = (-10, -2, -1, 1, 2, 10)


def retrospection_examples(examples: list[Example], seed: int) -> list[Example]:
    """Each example behind ROFT's retrospection prompt, its reference as the target: half after the right attempt
    (outcome ok), half after a near miss (outcome failed)."""
    rng = random.Random(seed)
    out = []
    for e in examples:
        ok = rng.random() < 0.5
        attempt = e.completion if ok else str(abs(int(e.answer) + rng.choice(NEAR_MISSES)))
        if attempt == e.completion:  # |answer - d| can land back on the answer
            ok = True
        feedback = contexts.OUTCOME_OK if ok else contexts.OUTCOME_FAILED
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
    path = D.sft_on(cfg, task, plain + retrospection_examples(plain, args.seed), args.seed, "roft_sft",
                    extra_chars=contexts.LABEL_CHARS + contexts.OUTCOME_OK + contexts.OUTCOME_FAILED)
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
    D.finish(args, cfg, "roft_vs_grpo", arms, rows, text, {"sft_heldout": sft, "k": k, "sft_steps": cfg.sft.steps}, t0)


if __name__ == "__main__":
    C.run_seeds(main, "roft_vs_grpo")
