"""Claim (CARE, Context-Adaptive Rubric Evolution): on a dialogue task whose ideal weighting of cognitive / affective / proactive support
changes with the turn, online RL rewarded by context-adaptive rubric weights (`care`, from a rubric generator
trained by SFT then preference RL) reaches a higher *true* context-dependent quality on held-out dialogues than
RL with a fixed uniform rubric; the oracle arm (the true w*) is the ceiling.

The rubric generator is the `care` stage's trainer (recipes/care/trainer.py): its held-out weight error
0.5 |w - w*|_1 after SFT (on turn-blind, noisy labels) and after preference RL is reported. The policy starts
from a format-only SFT (random replies of 1-4 moves), so no arm has seen the oracle's replies before RL.
Every arm rewards [care (weight 1) with rl.options.care.source = generator | uniform | oracle, correctness
(weight 0: the rate of best replies, monitored only)].

    .venv/bin/python experiments/care_dialogue.py [--steps N] [--policy-beta B] [--json FILE] [--tracking-uri URI] [--micro]
"""

from __future__ import annotations

import json
import random
import time

import _common as C
from posttrain import resolve
from posttrain.config import RewardSpec
from posttrain.models import build_tiny, load_pretrained, save_pretrained, train_char_tokenizer
from posttrain.tasks import Example
from posttrain.recipes.care import dialogue as D
from posttrain.recipes.care.rubric import generate_rubrics, weight_error
from posttrain.runtime import seed_everything
from posttrain.recipes.care.trainer import train_rubric_generator
from posttrain.trainers.sft import train_sft

DIALOGUE = ["task.name=dialogue", "task.n_train=3000", "task.n_heldout=300", "rl.max_new_tokens=5", "eval.max_new_tokens=5",
            "eval.n_prompts=300", "eval.batch_size=300", "sft.steps=150", "rl.lr=0.002"]
MICRO_CARE = ["care.n_sft=40", "care.n_preference=40", "care.n_heldout=20", "care.sft_steps=5", "care.rl_steps=2",
              "care.rl_prompts_per_step=4", "care.rl_group_size=2", "care.log_every=1"]
ARMS = ("generator", "uniform", "oracle")


def rubric_generator(cfg, seed: int):
    """(directory holding model/, the care stage's metrics): trained once per config."""
    objective = "_".join(str(getattr(cfg.rl, k)) for k in ("advantage", "loss", "loss_agg", "beta", "clip_eps_low", "clip_eps_high"))
    out = C.CACHE / f"care_{cfg.section_hash('model', 'care')}_{objective}_s{seed}"  # the rl budget of the policy arms does not matter here
    if not (out / "done").exists():
        out.mkdir(parents=True, exist_ok=True)
        metrics, _, _ = train_rubric_generator(cfg, out, on_log=lambda s, m: None)
        (out / "metrics.json").write_text(json.dumps(metrics))
        (out / "done").write_text("ok")
    return out, json.loads((out / "metrics.json").read_text())


def format_only_sft(cfg, seed: int):
    """(task, train, held-out, checkpoint, held-out metrics): SFT on random replies of 1-4 moves (not the best ones)."""
    from posttrain.eval.harness import evaluate
    from posttrain.tasks import build_task

    task = build_task(cfg.task)
    splits = task.splits(seed)
    train, held = splits["train"], splits["heldout"]
    path = C.CACHE / f"sft_random_replies_{cfg.section_hash('task', 'model', 'sft')}_s{seed}"
    if not (path / "done").exists():
        seed_everything(seed)
        rng = random.Random(seed)
        generic = [Example(e.prompt, D.random_reply(rng), e.answer) for e in train]
        tok = train_char_tokenizer([task.alphabet()])
        model = build_tiny(cfg.model, tok)
        train_sft(model, tok, generic, cfg.sft, seed, on_log=lambda s, m: None)
        save_pretrained(model, tok, path)
        (path / "done").write_text("ok")
    model, tok = load_pretrained(path)
    return task, train, held, path, evaluate(model, tok, task, held, cfg.eval, seed)[0]


def main() -> None:
    args = C.parse_args(__doc__.split("\n")[0], 200, [("--arms", str, ",".join(ARMS), "comma-separated weight sources to run"),
                                                      ("--policy-beta", float, None, "the policy arms' KL to their start (rl.beta); "
                                                       "the rubric generator's preference RL keeps rl.beta")])
    t0 = time.time()
    cfg = C.load_config(args, DIALOGUE + ["rl.rewards=[{name: care}]"] + (MICRO_CARE if args.micro else []))
    gen_dir, gen = rubric_generator(cfg, args.seed)
    print(f"rubric generator, held-out weight error: labels {gen['weight_error_labels']:.4f}, uniform {gen['weight_error_uniform']:.4f}, "
          f"after SFT {gen['weight_error_sft']:.4f}, after preference RL {gen['weight_error']:.4f}", flush=True)
    task, train, held, path, sft = format_only_sft(cfg, args.seed)
    generator_model, generator_tok = load_pretrained(gen_dir / "model")
    rubrics = generate_rubrics(generator_model, generator_tok, [e.prompt for e in held])
    gen_on_dialogues = sum(weight_error(r, e.prompt) for r, e in zip(rubrics, held)) / len(held)
    print(f"SFT held-out: true quality {sft['greedy_true_quality']:.4f}, best-reply rate {sft['greedy_accuracy']:.4f}; "
          f"generator weight error on these dialogues {gen_on_dialogues:.4f}", flush=True)
    arms, rows = {}, []
    k = max(1, min(20, args.steps // 5))
    for source in args.arms.split(","):
        options = {**cfg.rl.options, "care": {"source": source, "path": str(gen_dir)}}
        specs = (RewardSpec(name="care", weight=1.0), RewardSpec(name="correctness", weight=0.0))
        beta = {} if args.policy_beta is None else {"beta": args.policy_beta}
        rl_cfg = resolve.updated(cfg.rl, "rl", **{"rewards": specs, "options": options, **beta})
        history, after, seconds = C.run_arm(cfg, rl_cfg, task, train, held, path, args.seed)
        arms[source] = {"heldout_before": sft, "heldout_after": after, "rl_seconds": round(seconds, 1),
                        "care_reward_curve": C.curve(history, "reward/care_mean"), "best_reply_rate_curve": C.curve(history, "accuracy"),
                        "_history": history, "_cfg": cfg.model_copy(update={"rl": rl_cfg})}
        rows.append({"weights": source, "reward_first": C.window_mean(history, "reward/care_mean", True, k),
                     "reward_last": C.window_mean(history, "reward/care_mean", False, k),
                     "true_quality_before": sft["greedy_true_quality"], "true_quality_after": after["greedy_true_quality"],
                     "best_reply_before": sft["greedy_accuracy"], "best_reply_after": after["greedy_accuracy"]})
        print(f"{source}: {seconds:.0f}s, held-out true quality {sft['greedy_true_quality']:.4f} -> {after['greedy_true_quality']:.4f}",
              flush=True)
    text = C.print_table(
        f"\nOnline RL on the dialogue task, {args.steps} steps: care weights from the generator vs uniform vs oracle "
        f"(held-out greedy replies; true quality = w* . s, best reply = reaches the context's maximum)\n"
        f"rubric generator weight error: after SFT {gen['weight_error_sft']:.4f} -> after preference RL {gen['weight_error']:.4f} "
        f"(uniform {gen['weight_error_uniform']:.4f}); pair accuracy {gen['pair_accuracy_sft']:.4f} -> {gen['pair_accuracy']:.4f}", rows)
    runs = {}
    if cfg.tracking.enabled:
        for source, a in arms.items():
            final = {f"heldout_{m}": v for m, v in a["heldout_after"].items()} | {f"generator_{m}": v for m, v in gen.items()}
            runs[source] = C.log_arm(a["_cfg"], f"care_dialogue/{source}", a["_history"], final, rows, text)
    for a in arms.values():
        a.pop("_history"), a.pop("_cfg")
    results = {"claim": "care_dialogue", "steps": args.steps, "policy_beta": cfg.rl.beta if args.policy_beta is None else args.policy_beta,
               "sft_heldout": sft, "rubric_generator": gen,
               "generator_weight_error_on_heldout_dialogues": gen_on_dialogues, "arms": arms, "table": rows,
               "mlflow_runs": runs, "runtime_s": round(time.time() - t0, 1)}
    print(f"runtime {results['runtime_s']}s")
    C.write_json(args, results)


if __name__ == "__main__":
    C.run_seeds(main, "care_dialogue")
