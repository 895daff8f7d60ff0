"""Teacher-side extras for the on-policy distillation family, computed on the student's own rollouts.

Each provider has the `EXTRAS` signature of trainers/online_rl.py, `(run, prompts, batch, reference)`, and
is computed only when a selected estimator, loss or auxiliary term `needs` it. Separate teacher models
(`run.teachers["teacher"]`, `run.teachers["base"]`) are frozen; self-teachers are the policy read under
`torch.no_grad` with a privileged context (objectives/distill/contexts.py). Nothing returned carries
gradient (asserted in `teacher_forward`).

Stateful schedules (GATS's success EMA, UniOPSD's correlation EMA) keep their state in `run.state`, which
the trainer owns, so the estimators themselves stay pure functions of the batch.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from posttrain.errors import UserError
from posttrain.models.teacher import teacher_forward
from posttrain.objectives.distill import contexts
from posttrain.rollout import RolloutBatch
from posttrain.models.sampling import sample
from posttrain.models.sampling import decode_completions
from posttrain.tasks import Example
from posttrain.models.sampling import encode_prompts

if TYPE_CHECKING:
    from posttrain.trainers.online_rl import RLRun


def teacher_model(run: RLRun, role: str, need: str):
    model = run.teachers.get(role)
    if model is None:
        raise UserError(f"{need} needs a frozen {role} model: run `posttrain distill` (its `{role}` input) instead of `rl`")
    return model


def row_examples(prompts: list[Example], batch: RolloutBatch) -> list[Example]:
    """The prompt example of every row (prompts are in group-id order)."""
    _, index = torch.unique(batch.group, return_inverse=True)
    return [prompts[i] for i in index.tolist()]


def success(run: RLRun, batch: RolloutBatch) -> Tensor:
    """[B] bool: the rollout solved its task (the `correctness` reward if listed, else weighted reward > 0)."""
    rewards = torch.nan_to_num(batch.rewards, nan=0.0)
    if "correctness" in batch.reward_names:
        return rewards[:, batch.reward_names.index("correctness")] >= 1.0
    return rewards @ batch.reward_weights > 0


def score_as_student(model, run: RLRun, batch: RolloutBatch, hidden: bool = False):
    """The batch's completions read by a frozen `model` after the student's own prompts."""
    return teacher_forward(model, batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask, run.cfg.temperature, hidden)


def score_under(model, run: RLRun, context_texts: list[str], batch: RolloutBatch, hidden: bool = False):
    """The batch's completions read by `model` after per-row context texts (no gradient)."""
    ids, mask = encode_prompts(run.tokenizer, context_texts, batch.completion_ids.device)
    return teacher_forward(model, ids, mask, batch.completion_ids, batch.completion_mask, run.cfg.temperature, hidden)


@torch.no_grad()
def generate(run: RLRun, model, prompt_texts: list[str], max_tokens: int, temperature: float = 1.0, greedy: bool = False,
             group_size: int = 1):
    """`group_size` samples from `model` after each prompt text (no gradient): (Samples, decoded texts)."""
    tok = run.tokenizer
    ids, mask = encode_prompts(tok, prompt_texts, next(model.parameters()).device)
    out = sample(
        model, ids, mask, group_size=group_size, max_new_tokens=max_tokens, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
        temperature=temperature, greedy=greedy,
    )
    return out, decode_completions(tok, out)


def group_rows(batch: RolloutBatch) -> list[list[int]]:
    _, index = torch.unique(batch.group, return_inverse=True)
    rows: dict[int, list[int]] = {}
    for i, g in enumerate(index.tolist()):
        rows.setdefault(g, []).append(i)
    return list(rows.values())


# --- separate teacher / base models -------------------------------------------------------------------

def teacher_logp(run, prompts, batch, reference) -> Tensor:
    """[B, T] sampled-token log-probs under the frozen teacher, same prompt as the student."""
    model = teacher_model(run, "teacher", "teacher_logp")
    return score_as_student(model, run, batch).sampled(batch.completion_ids)


def teacher_hidden(run, prompts, batch, reference) -> Tensor:
    """[L, B, T, d] hidden states of every layer of the frozen teacher on the student's rollouts."""
    model = teacher_model(run, "teacher", "teacher_hidden")
    return score_as_student(model, run, batch, hidden=True).hidden


def base_hidden(run, prompts, batch, reference) -> Tensor:
    """[L, B, T, d] hidden states of the frozen pre-RL base (RIDE's B)."""
    model = teacher_model(run, "base", "base_hidden")
    return score_as_student(model, run, batch, hidden=True).hidden


def teacher_logprobs(run, prompts, batch, reference) -> Tensor:
    """[B, T, V] full next-token log-probs of the frozen teacher."""
    model = teacher_model(run, "teacher", "teacher_logprobs")
    return score_as_student(model, run, batch).logprobs


def base_logprobs(run, prompts, batch, reference) -> Tensor:
    """[B, T, V] full next-token log-probs of the frozen base."""
    model = teacher_model(run, "base", "base_logprobs")
    return score_as_student(model, run, batch).logprobs


# --- self-teachers: the policy with privileged context -------------------------------------------------

def privileged_logprobs(run, prompts, batch, reference) -> Tensor:
    """[B, T, V] OPSD's teacher: the policy itself, told the reference solution."""
    texts = [contexts.answer_context(e) for e in row_examples(prompts, batch)]
    return score_under(run.policy, run, texts, batch).logprobs


def contrast_logp_gap(run, prompts, batch, reference) -> Tensor:
    """[B, T] SIPO's d = logp(y | x, C+) - logp(y | x, C-), the policy as a contrastive self-teacher."""
    limit = run.cfg.options_for("sipo").max_mistakes
    examples, texts, ok = row_examples(prompts, batch), decode_completions(run.tokenizer, batch), success(run, batch).tolist()
    positive, negative = [""] * batch.size, [""] * batch.size
    for rows in group_rows(batch):
        for own in rows:
            mistakes = contexts.group_mistakes([texts[j] for j in rows], [ok[j] for j in rows], rows.index(own), limit)
            positive[own], negative[own] = contexts.contrastive_contexts(examples[own], mistakes)
    ids = batch.completion_ids
    return score_under(run.policy, run, positive, batch).sampled(ids) - score_under(run.policy, run, negative, batch).sampled(ids)


def peer_logp_gap(run, prompts, batch, reference) -> Tensor:
    """[B, T] UniOPSD's Delta = logp_T - logp_S, the teacher being the policy with a successful peer of the
    same group in context; 0 on rows of groups without a success (untaught rows)."""
    examples, texts, ok = row_examples(prompts, batch), decode_completions(run.tokenizer, batch), success(run, batch).tolist()
    peer_texts, taught = [], []
    group_of = {i: rows for rows in group_rows(batch) for i in rows}
    for i in range(batch.size):
        rows = group_of[i]
        peers = [j for j in rows if ok[j] and j != i] or [j for j in rows if ok[j]]
        taught.append(bool(peers))
        peer_texts.append(contexts.peer_context(examples[i], texts[peers[0]] if peers else ""))
    teacher = score_under(run.policy, run, peer_texts, batch).sampled(batch.completion_ids)
    gap = (teacher - batch.old_logp) * batch.completion_mask
    return gap * torch.tensor(taught, dtype=gap.dtype, device=gap.device)[:, None]


@torch.no_grad()
def trace_logprobs(run, prompts, batch, reference) -> Tensor:
    """[B, T, V] ThinkOPD's teacher with a think trace z in context: z is the teacher's own greedy response
    to the prompt, generated once per prompt and shared by the group. The teacher is the `teacher` model when
    one is given, else the policy (same-model setting)."""
    model = run.teachers.get("teacher", run.policy)
    _, traces = generate(run, model, [e.prompt for e in prompts], run.cfg.max_new_tokens, greedy=True)
    _, index = torch.unique(batch.group, return_inverse=True)
    texts = [contexts.trace_context(prompts[g], traces[g]) for g in index.tolist()]
    return score_under(model, run, texts, batch).logprobs


@torch.no_grad()
def skill_hidden(run, prompts, batch, reference) -> Tensor:
    """[L, B, T, d] PR-OPD's teacher: the policy re-reading its own response with a hindsight skill k_i it
    wrote itself (from the response and its outcome) prepended."""
    opts = run.cfg.options_for("pr_opd")
    if run.state.get("step", 1) <= opts.warm_start:  # GRPO warm start: no skills written, no teacher pass
        return torch.empty(0)
    examples, texts, ok = row_examples(prompts, batch), decode_completions(run.tokenizer, batch), success(run, batch).tolist()
    hindsight = [contexts.hindsight_prompt(e, t, s) for e, t, s in zip(examples, texts, ok)]
    _, skills = generate(run, run.policy, hindsight, opts.skill_tokens, run.cfg.temperature)
    return score_under(run.policy, run, [contexts.skill_context(e, k) for e, k in zip(examples, skills)], batch, hidden=True).hidden


@torch.no_grad()
def retrospections(run, prompts, batch, reference) -> Tensor:
    """[B, 3, W] ROFT: for each attempt, a retrospection sampled on-policy from the current model after a
    prompt holding the attempt and the task's feedback; rows are (token ids, attention mask, loss mask),
    the loss mask being 1 on retrospection tokens only."""
    opts, tok = run.cfg.options_for("roft"), run.tokenizer
    examples, texts, ok = row_examples(prompts, batch), decode_completions(tok, batch), success(run, batch).tolist()
    feedback = [e.completion if not s else t for e, t, s in zip(examples, texts, ok)]  # the checker's feedback: the expected output
    retro_prompts = [contexts.retrospection_prompt(e, t, f) for e, t, f in zip(examples, texts, feedback)]
    ids, mask = encode_prompts(tok, retro_prompts, batch.group.device)
    retro, _ = generate(run, run.policy, retro_prompts, opts.max_tokens, opts.temperature)
    width = ids.shape[1] + retro.completion_ids.shape[1]
    out = torch.zeros(batch.size, 3, width, dtype=torch.long, device=ids.device)
    out[:, 0] = torch.cat([ids, retro.completion_ids], 1)
    out[:, 1] = torch.cat([mask, retro.completion_mask], 1)
    out[:, 2, ids.shape[1]:] = retro.completion_mask
    return out


# --- schedules with state ------------------------------------------------------------------------------

def train_step(run, prompts, batch, reference) -> Tensor:
    """The 1-based index of the current update (for warm starts and warm-down schedules)."""
    return torch.tensor(float(run.state.get("step", 1)))


@torch.no_grad()
def measure_success(run: RLRun, model, prompts: list[Example], samples_per_prompt: int) -> float:
    """Mean verifier success of `model` sampled on `prompts` (GATS's fixed teacher reference S_T)."""
    tok = run.tokenizer
    ids, mask = encode_prompts(tok, [e.prompt for e in prompts], next(model.parameters()).device)
    sampler = run.task.sampler(tok) if hasattr(run.task, "sampler") else sample  # episodes, for multi-turn envs
    out = sampler(
        model, ids, mask, group_size=samples_per_prompt, max_new_tokens=run.cfg.max_new_tokens, eos_id=tok.eos_token_id,
        pad_id=tok.pad_token_id, temperature=run.cfg.temperature,
    )
    texts = decode_completions(tok, out)
    rows = [e for e in prompts for _ in range(samples_per_prompt)]
    return sum(run.task.correctness_reward(t, f, e) for t, f, e in zip(texts, out.finished.tolist(), rows)) / len(rows)


def gats_weight(run, prompts, batch, reference) -> Tensor:
    """[B] GATS's w(k), after updating the student's success EMA with this batch (state in run.state)."""
    from posttrain.objectives.distill.gats import GATSState, gap_weight

    opts = run.cfg.options_for("gats")
    state: GATSState = run.state.setdefault("gats", GATSState())
    if state.teacher_success is None:
        state.teacher_success = opts.teacher_success if opts.teacher_success is not None else measure_success(
            run, teacher_model(run, "teacher", "gats"), prompts, run.cfg.group_size
        )
    state.update(float(success(run, batch).float().mean()), opts)
    w = gap_weight(state.student_success, state.teacher_success, opts, state.latched)
    return torch.full((batch.size,), w, device=batch.group.device)


def uniopsd_rho(run, prompts, batch, reference) -> Tensor:
    """UniOPSD's shrunken historical correlation rho_used (from steps before this one); then folds this
    step's Pearson corr(A^S, A^O) into the EMA for the next step."""
    from posttrain.objectives.distill.uniopsd import TrustState, step_tier

    opts = run.cfg.options_for("uniopsd")
    state: TrustState = run.state.setdefault("uniopsd", TrustState())
    used = state.rho_used(opts)
    gap = batch.extras["peer_logp_gap"] if "peer_logp_gap" in batch.extras else peer_logp_gap(run, prompts, batch, reference)
    tier = step_tier(batch, gap, run.cfg, opts)
    state.update(tier.a_step, tier.a_teacher, tier.both, opts)
    return torch.tensor(used)


def export_state(state: dict) -> dict:
    """`run.state` as plain dicts and tensors (what `torch.load(weights_only=True)` reads back), for checkpoints."""
    out = {}
    for key in ("gats", "uniopsd"):
        if key in state:
            out[key] = asdict(state[key])
    if "pr_opd" in state:
        projectors, optimizer = state["pr_opd"]
        out["pr_opd_saved"] = {"projectors": projectors.state_dict(), "optimizer": optimizer.state_dict()}
    return out


def import_state(saved: dict) -> dict:
    """The inverse of `export_state`; PR-OPD's projectors are rebuilt from `pr_opd_saved` on first use."""
    from posttrain.objectives.distill.gats import GATSState
    from posttrain.objectives.distill.uniopsd import TrustState

    state: dict = {}
    if "gats" in saved:
        state["gats"] = GATSState(**saved["gats"])
    if "uniopsd" in saved:
        state["uniopsd"] = TrustState(**saved["uniopsd"])
    if "pr_opd_saved" in saved:
        state["pr_opd_saved"] = saved["pr_opd_saved"]
    return state


PROVIDERS = {
    "teacher_logp": teacher_logp, "teacher_hidden": teacher_hidden, "base_hidden": base_hidden,
    "teacher_logprobs": teacher_logprobs, "base_logprobs": base_logprobs,
    "privileged_logprobs": privileged_logprobs, "contrast_logp_gap": contrast_logp_gap, "peer_logp_gap": peer_logp_gap,
    "trace_logprobs": trace_logprobs, "skill_hidden": skill_hidden, "retrospections": retrospections,
    "train_step": train_step, "gats_weight": gats_weight, "uniopsd_rho": uniopsd_rho,
}
