"""Claim (ThinkOPD): routing on-policy distillation by trace-response divergence (TRD) and reward gain beats Uniform
ThinkOPD (every sibling response distilled equally under one shared think trace) and plain OPD (a teacher without
the trace), on a task whose responses take different routes to the answer.

Task: 2-digit addition with worked steps (`task.options.arithmetic.worked_steps`): each reference writes its steps
along one of two routes (column sums with carries, or place-value split), then `:answer`. The teacher is a tiny model
SFT-trained on the worked steps of both routes, plain and with a think trace in front of the prompt (the steps of the
same route, or, for a share `--mismatched`, of the other one), so it reads a trace as reasoning to follow. Its think
trace in RL is its own greedy steps (`Task.think_trace`, without the answer). The student is a weaker SFT model
(`--student-sft-steps`) on the same references. Three arms, same seed, start and budget:
  opd        the OPD token advantage logp_T - logp_S with the clipped surrogate, the teacher reading the bare prompt
  uniform    ThinkOPD's divergence to the trace-reading teacher, every response weighted 1 (Uniform ThinkOPD)
  think_opd  the same divergence, responses weighted by G softmax(a gain + b compatibility) within the group
Reported: held-out greedy / sampled accuracy, training accuracy, and, before RL, route compatibility: the mean TRD of
student responses on the trace's route vs on the other route, and the ThinkOPD weight each kind gets.

    .venv/bin/python experiments/think_opd_worked_steps.py [--steps N] [--teacher-sft-steps M] [--student-sft-steps K] [--json FILE] [--micro]
"""

from __future__ import annotations

import random
import time

import torch

import _common as C
import _distill as D
from posttrain import resolve
from posttrain.models import load_pretrained
from posttrain.models.logprobs import completion_forward
from posttrain.rollout.sampling import encode_prompts, generate
from posttrain.objectives.distill.divergence import reverse_kl
from posttrain.objectives.distill.think_opd import route_weights
from posttrain.rollout import RolloutBatch
from posttrain.tasks import Example
from posttrain.tasks.arithmetic import step_route, worked_steps
from posttrain.trainers import contexts
from posttrain.trainers.extras import ExtraContext, trace_logprobs

ARMS = ("opd", "uniform", "think_opd")
TASK = ["task.options.arithmetic.worked_steps=true", "task.operations=[\"+\"]", "rl.max_new_tokens=24", "eval.max_new_tokens=24"]
SETTINGS = {
    "opd": {"advantage": "opd", "loss": "clip", "aux": (), "options": {"opd": {"weight": 1.0, "reward_weight": 0.0}}},
    "uniform": {"advantage": "grpo", "loss": "none", "aux": ("think_opd",), "options": {"think_opd": {"uniform": True}}},
    "think_opd": {"advantage": "grpo", "loss": "none", "aux": ("think_opd",), "options": {"think_opd": {"uniform": False}}},
}


def teacher_examples(task, examples: list[Example], mismatched: float, seed: int) -> list[Example]:
    """Each reference plain, and once more after a think trace: its own steps, or (share `mismatched`) the steps
    of the other route, so the teacher learns to follow a trace and to answer when it does not fit."""
    rng, d, out = random.Random(seed), task.cfg.digits, []
    for e in examples:
        route = e.metadata["route"]
        other = "split" if route == "column" else "column"
        a, op, b = int(e.prompt[:d]), e.prompt[d], int(e.prompt[d + 1 : -1])
        trace = worked_steps(a, op, b, other if rng.random() < mismatched else route, d)
        out += [e, Example(prompt=contexts.trace_context(e, trace), completion=e.completion, answer=e.answer)]
    return out


@torch.no_grad()
def route_compatibility(cfg, task, student, teacher, tok, prompts: list[Example], seed: int) -> dict:
    """Before RL: G student samples per prompt, the teacher's greedy trace, TRD_i = mask-mean_t KL(pi_S || pi_T(.|z)),
    split by whether response i follows the route of the trace; and the ThinkOPD weight each kind gets."""
    g = cfg.rl.group_size
    ids, mask = encode_prompts(tok, [e.prompt for e in prompts], torch.device("cpu"))
    out, texts = generate(student, tok, prompts, cfg.rl.max_new_tokens, group_size=g, generator=torch.Generator().manual_seed(seed))
    _, greedy = generate(teacher, tok, prompts, cfg.rl.max_new_tokens, greedy=True)
    rows = [e for e in prompts for _ in range(g)]
    correct = torch.tensor([task.correctness_reward(t, f, e) for t, f, e in zip(texts, out.finished.tolist(), rows)])
    batch = RolloutBatch(ids.repeat_interleave(g, 0), mask.repeat_interleave(g, 0), out.completion_ids, out.completion_mask,
                         torch.arange(len(prompts)).repeat_interleave(g), out.logp, correct[:, None], ("correctness",), torch.ones(1))
    ctx = ExtraContext(student, tok, task, cfg.rl, {"teacher": teacher}, 1, torch.Generator().manual_seed(seed))
    teacher_lp = trace_logprobs(ctx, prompts, batch)
    student_lp = completion_forward(student, batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.attention_mask, full=True).logprobs
    m = batch.completion_mask.float()
    trd = (reverse_kl(student_lp, teacher_lp) * m).sum(-1) / m.sum(-1).clamp(min=1.0)
    opts = cfg.rl.options_for("think_opd")
    weights = route_weights(correct, trd, batch.group, opts.a, opts.b, opts.temperature, opts.eps)
    trace_route = [step_route(greedy[i // g]) for i in range(len(texts))]
    same = torch.tensor([step_route(t) is not None and step_route(t) == r for t, r in zip(texts, trace_route)])
    cross = torch.tensor([step_route(t) is not None and r is not None and step_route(t) != r for t, r in zip(texts, trace_route)])
    mean = lambda x, sel: float(x[sel].mean()) if sel.any() else float("nan")  # noqa: E731
    return {"responses": len(texts), "same_route_share": float(same.float().mean()), "cross_route_share": float(cross.float().mean()),
            "trd_same_route": mean(trd, same), "trd_cross_route": mean(trd, cross), "trd_std": float(trd.std()),
            "weight_same_route": mean(weights, same), "weight_cross_route": mean(weights, cross), "weight_max": float(weights.max()),
            "trace_has_answer": sum(task.think_trace(t) == t for t in greedy) / len(greedy)}


def main() -> None:
    args = C.parse_args(__doc__.split("\n")[0], 60, [("--teacher-sft-steps", int, 600, "SFT steps of the teacher"),
                                                     ("--student-sft-steps", int, 200, "SFT steps of the (weaker) student"),
                                                     ("--mismatched", float, 0.3, "share of the teacher's traced references whose trace is the other route")])
    t0 = time.time()
    cfg = C.load_config(args, TASK)
    task = C.build_task(cfg.task)
    splits = task.splits(args.seed)
    train, held = splits["train"], splits["heldout"]
    refs = train[: cfg.sft.n_examples or None]
    teacher_path = D.sft_on(cfg, task, teacher_examples(task, refs, args.mismatched, args.seed), args.seed, "think_teacher", steps=args.teacher_sft_steps)
    student_path = D.sft_on(cfg, task, refs, args.seed, "think_student", steps=args.student_sft_steps)
    (teacher, tok), (student, _) = load_pretrained(teacher_path), load_pretrained(student_path)
    teacher_held, sft = C.evaluate(teacher, tok, task, held, cfg.eval, args.seed)[0], C.evaluate(student, tok, task, held, cfg.eval, args.seed)[0]
    print(f"teacher held-out greedy {teacher_held['greedy_accuracy']:.4f}; student start {sft['greedy_accuracy']:.4f}", flush=True)
    compat = route_compatibility(cfg, task, student, teacher, tok, train[: cfg.rl.prompts_per_step], args.seed)
    print(f"route compatibility before RL: {compat}", flush=True)
    k = max(1, args.steps // 5)
    arms = {}
    for arm in ARMS:
        rl_cfg = resolve.updated(cfg.rl, "rl", **SETTINGS[arm])
        history, after, seconds = C.run_arm(cfg, rl_cfg, task, train, held, student_path, args.seed, teachers={"teacher": D.frozen(teacher_path)})
        arms[arm] = {"heldout_after": after, "rl_seconds": round(seconds, 1), "_history": history, "_cfg": cfg.model_copy(update={"rl": rl_cfg})}
        print(f"{arm}: {seconds:.0f}s, held-out greedy {sft['greedy_accuracy']:.4f} -> {after['greedy_accuracy']:.4f}", flush=True)
    rows = [D.summary_row(a, arms[a], k) for a in ARMS]
    text = C.print_table(f"\nThinkOPD vs Uniform ThinkOPD vs OPD on worked-steps addition, {args.steps} steps, "
                         f"teacher held-out {teacher_held['greedy_accuracy']:.4f}, student start {sft['greedy_accuracy']:.4f}", rows)
    D.finish(args, cfg, "think_opd_worked_steps", arms, rows, text,
             {"sft_heldout": sft, "teacher_heldout": teacher_held, "route_compatibility": compat, "k": k,
              "teacher_sft_steps": args.teacher_sft_steps, "student_sft_steps": args.student_sft_steps}, t0)


if __name__ == "__main__":
    C.run_seeds(main, "think_opd_worked_steps")
