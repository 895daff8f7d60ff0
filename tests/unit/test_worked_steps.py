"""Arithmetic with worked steps (task.options.arithmetic.worked_steps) and ThinkOPD's think trace on it: the steps are
correct (recomputed here from the step strings alone), the trace is the steps without the answer, and the teacher
reads that trace in front of the prompt while scoring the student's response tokens."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from posttrain import resolve
from posttrain.errors import UserError
from posttrain.tasks import build_task
from posttrain.tasks.arithmetic import step_route, worked_steps

PARAMS = Path(__file__).resolve().parents[2] / "params.yaml"
STEP = re.compile(r"(\d+)([+*])(\d+)(?:\+(\d+))?=(\d+)")


def worked_task(ops='["+", "*"]', **options):
    sets = [f"task.options.arithmetic.{k}={v}" for k, v in {"worked_steps": "true", **options}.items()]
    cfg = resolve.load(PARAMS, [f"task.operations={ops}", "task.n_train=200", "task.n_heldout=50", *sets])
    return build_task(cfg.task), cfg


def recompute(prompt: str, completion: str, digits: int) -> str:
    """Checks every step of `completion` and that they lead to its answer; returns the route they follow."""
    a, op, b = int(prompt[:digits]), prompt[digits], int(prompt[digits + 1 : -1])
    steps, answer = completion.rsplit(":", 1)
    parsed = [STEP.fullmatch(s) for s in steps.split(",")]
    assert all(parsed), completion
    for m in parsed:  # each step is a true equation
        x, sign, y, carry, result = int(m[1]), m[2], int(m[3]), int(m[4] or 0), int(m[5])
        assert (x + y + carry if sign == "+" else x * y) == result, (completion, m[0])
    assert int(answer) == (a + b if op == "+" else a * b)
    route = step_route(completion)
    if op == "+" and route == "column":  # digit columns from the units, each carry the previous column's tens
        carry = 0
        for k, m in enumerate(parsed):
            assert (int(m[1]), int(m[3]), int(m[4] or 0)) == (a // 10**k % 10, b // 10**k % 10, carry)
            carry = int(m[5]) // 10
        assert int("".join(m[5] if k == len(parsed) - 1 else str(int(m[5]) % 10) for k, m in reversed(list(enumerate(parsed))))) == int(answer)
    elif op == "+":  # running total: a plus b's place-value parts, highest first
        total = a
        for m, part in zip(parsed, [int(d) * 10**k for k, d in reversed(list(enumerate(reversed(f"{b:0{digits}d}"))))], strict=True):
            assert (int(m[1]), int(m[3])) == (total, part)
            total = int(m[5])
        assert total == int(answer)
    elif route == "column":  # partial products a * digit, units first, shifted and summed give the answer
        assert [int(m[3]) for m in parsed] == [int(d) for d in reversed(f"{b:0{digits}d}")]
        assert sum(int(m[5]) * 10**k for k, m in enumerate(parsed)) == int(answer)
    else:  # a * place parts, then the running sum of the products
        products = [m for m in parsed if m[2] == "*"]
        assert sum(int(m[3]) for m in products) == b and int(parsed[-1][5]) == int(answer)
    return route


def test_worked_steps_are_correct_and_follow_both_routes():
    task, cfg = worked_task()
    routes, ops = set(), set()
    for split in task.splits(0).values():
        for e in split:
            route = recompute(e.prompt, e.completion, cfg.task.digits)
            assert route == e.metadata["route"] and task.parse(e.completion) == e.answer
            assert task.correctness_reward(e.completion, True, e) == 1.0 and task.format_reward(e.completion, True) == 1.0
            routes.add(route)
            ops.add(e.prompt[cfg.task.digits])
    assert routes == {"column", "split"} and ops == {"+", "*"}
    assert set(task.alphabet()) >= set("".join(e.completion for e in task.splits(0)["train"]))


def test_hand_worked_examples():
    assert worked_steps(37, "+", 48, "column", 2) == "7+8=15,3+4+1=8"
    assert worked_steps(37, "+", 48, "split", 2) == "37+40=77,77+8=85"
    assert worked_steps(37, "*", 48, "column", 2) == "37*8=296,37*4=148"
    assert worked_steps(37, "*", 48, "split", 2) == "37*40=1480,37*8=296,1480+296=1776"
    assert worked_steps(95, "+", 17, "column", 2) == "5+7=12,9+1+1=11"  # the last column keeps its carry digit: 112
    assert worked_steps(9, "+", 28, "split", 2) == "09+20=29,29+8=37"  # zero-padded: not a column step
    assert step_route("09+20=29,29+8=37:37") == "split" and step_route("9+8=17,0+2+1=3:37") == "column" and step_route("37") is None


def test_only_the_answer_counts_and_malformed_steps_do_not_parse():
    task, _ = worked_task()
    e = next(e for e in task.splits(0)["train"] if e.prompt[2] == "+")
    assert task.parse(e.completion) == e.answer
    assert task.parse(e.answer) is None and task.parse(e.completion + ":") is None and task.parse("") is None
    assert task.correctness_reward(f"{task.think_trace(e.completion)}:{int(e.answer) + 1}", True, e) == 0.0


def test_think_trace_is_the_steps_not_the_answer():
    task, _ = worked_task(routes="[split]")
    for e in task.splits(1)["train"]:
        trace = task.think_trace(e.completion)
        assert trace != e.completion and trace != e.answer and ":" not in trace
        assert e.completion == f"{trace}:{e.answer}" and step_route(e.completion) == "split"
    plain = build_task(resolve.load(PARAMS, []).task)
    assert plain.think_trace("85") == "85"  # without worked steps the whole completion is all the reasoning there is


def test_worked_steps_refuse_subtraction_and_quality_tags():
    with pytest.raises(UserError, match="worked_steps"):
        worked_task(ops='["-"]')[0].splits(0)
    with pytest.raises(UserError, match="worked_steps"):
        worked_task(quality_tags="true")[0].splits(0)


def test_teacher_reads_the_steps_before_the_prompt_and_scores_the_response_tokens(monkeypatch):
    """The trace provider puts the teacher's greedy steps (never its `:answer`) in front of the prompt, and its
    log-probs are over the student's response tokens, where ThinkOPD's TRD is measured."""
    from posttrain.models import build_tiny, train_char_tokenizer
    from posttrain.rollout.sampling import encode_prompts, sample
    from posttrain.rollout import RolloutBatch
    from posttrain.trainers import extras

    task, cfg = worked_task(ops='["+"]')
    tok = train_char_tokenizer([task.alphabet()])
    torch.manual_seed(0)
    model = build_tiny(cfg.model.model_copy(update={"hidden_size": 32, "intermediate_size": 64, "layers": 1}), tok)
    prompts = task.splits(0)["train"][:2]
    ids, mask = encode_prompts(tok, [e.prompt for e in prompts], torch.device("cpu"))
    out = sample(model, ids, mask, group_size=2, max_new_tokens=5, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, generator=torch.Generator().manual_seed(0))
    batch = RolloutBatch(ids.repeat_interleave(2, 0), mask.repeat_interleave(2, 0), out.completion_ids, out.completion_mask,
                         torch.arange(2).repeat_interleave(2), out.logp, torch.ones(4, 1), ("correctness",), torch.ones(1))
    greedy = [e.completion for e in prompts]  # the teacher "answers" with worked steps and the answer
    monkeypatch.setattr(extras, "generate", lambda *a, **k: (None, greedy))
    seen = []
    real = extras.score_under
    monkeypatch.setattr(extras, "score_under", lambda m, ctx, texts, b, **k: seen.append(texts) or real(m, ctx, texts, b, **k))
    ctx = extras.ExtraContext(model, tok, task, cfg.rl, {}, 1, torch.Generator().manual_seed(0))
    teacher = extras.trace_logprobs(ctx, prompts, batch)
    steps = [task.think_trace(c) for c in greedy]
    contexts = [[t.prompt for t in texts] for texts in seen]  # each row's example, its prompt the context (system kept)
    assert contexts == [[f"{steps[i // 2]}={prompts[i // 2].prompt}" for i in range(4)]]
    assert all(":" not in t for t in contexts[0])  # no `:answer` in the teacher's context
    assert teacher.shape == (*batch.completion_ids.shape, len(tok)) and not teacher.requires_grad
    bare = extras.score_under(model, ctx, [e.prompt for e in prompts for _ in range(2)], batch).logprobs
    assert not torch.allclose(teacher, bare)  # the trace changes the teacher's targets
