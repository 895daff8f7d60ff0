"""Extras: the tensors an objective may need beyond the rollout, each made by one registered provider.

An estimator, loss or auxiliary term declares `needs=("teacher_logp", ...)`; the trainer calls exactly the
providers of those names after each rollout and puts their tensors in `batch.extras`. A provider declares
in its registry meta:

- `role`: the model it reads besides the policy (`reference`, `teacher`, `base`, `critic`); a stage loads
  exactly the roles the chosen parts need (`roles_needed`), and the trainer builds the `reference` (a frozen
  copy of the starting policy) and the `critic` (rl.critic; trained when a part declares `critic=True`) itself. `optional_role=True`: the provider falls back to the policy when the role is absent.
- `state`: a factory of the state object it keeps between updates (`state_dict` / `load_state_dict`); the
  trainer creates it, passes it as `ctx.state` and checkpoints it under the provider's name.

    Provider(ctx: ExtraContext, prompts: list[Example] (one per group), batch: RolloutBatch) -> Tensor

Frozen models are read under `torch.no_grad` (asserted in `teacher_forward`); self-teachers are the policy
read with a privileged context (trainers/contexts.py). Sampling inside a provider uses the trainer's
generator, so a resumed run draws the same numbers as an uninterrupted one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from posttrain.config import RLConfig
from posttrain.errors import UserError, assert_no_grad
from posttrain.rollout.policy import Policy
from posttrain.rollout.sampling import decode_completions, encode_prompts, generate
from posttrain.models.chat import uses_chat
from posttrain.models.teacher import teacher_forward
from posttrain.models.value import token_values
from posttrain.objectives import advantages, auxiliaries, losses, needs_of
from posttrain.objectives.distill.gats import GATSState, gap_weight
from posttrain.objectives.distill.pr_opd import admissible_skill, pick_skills
from posttrain.objectives.distill.uniopsd import TrustState, step_tier, successful_peers
from posttrain.registry import Registry
from posttrain.rewards import reward_matrix
from posttrain.rollout import RolloutBatch
from posttrain.tasks import Example, Task
from posttrain.trainers import contexts

extras: Registry = Registry("extra")

@dataclass(frozen=True)
class ExtraContext:
    policy: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    task: Task
    cfg: RLConfig
    models: Mapping[str, PreTrainedModel]  # frozen models by role
    step: int  # 1-based index of the current update
    generator: torch.Generator
    state: Any = None  # this provider's declared state
    adapter: Policy | None = None  # the run's Policy (rollout/policy.py); None or a CausalLMPolicy: a causal LM's way

    def model(self, role: str, need: str) -> PreTrainedModel:
        if role not in self.models:
            raise role_missing(need, role)
        return self.models[role]

    @property
    def device(self) -> torch.device:
        return next(self.policy.parameters()).device


def role_missing(need: str, role: str) -> UserError:
    return UserError(f"{need} needs a frozen {role} model: run `posttrain distill` (its `{role}` input) instead of `rl`")


def check_providers(cfg: RLConfig, key: str = "rl") -> None:
    """Every tensor the configured objective needs has a registered provider (a UserError naming the first that has none)."""
    for need in sorted(needs_of(cfg)):
        if need not in extras:
            raise UserError(f"{key}: the objective needs {need!r}, which no registered extra provides ({extras.unknown_message(need)})")


def roles_needed(cfg: RLConfig, optional: bool = True) -> frozenset[str]:
    """The frozen model roles the configured objective's extras read (optional ones included unless `optional` is False)."""
    metas = [extras.entry(n).meta for n in needs_of(cfg) if n in extras]
    return frozenset(m["role"] for m in metas if m.get("role") and (optional or not m.get("optional_role")))


def provide(needs, ctx_for, prompts: list[Example], batch: RolloutBatch) -> RolloutBatch:
    """`batch` with every needed extra added, in name order; `ctx_for(name)` gives each provider its context."""
    for need in sorted(needs):
        value = extras.get(need)(ctx_for(need), prompts, batch)
        assert_no_grad(**{need: value})
        batch = batch.with_extras(**{need: value})
    return batch


# --- shared pieces ----------------------------------------------------------------------------------------

def row_examples(prompts: list[Example], batch: RolloutBatch) -> list[Example]:
    """The prompt example of every row (prompts are in group-id order)."""
    _, index = torch.unique(batch.group, return_inverse=True)
    return [prompts[i] for i in index.tolist()]


def group_rows(batch: RolloutBatch) -> list[list[int]]:
    _, index = torch.unique(batch.group, return_inverse=True)
    rows: dict[int, list[int]] = {}
    for i, g in enumerate(index.tolist()):
        rows.setdefault(g, []).append(i)
    return list(rows.values())


def success(batch: RolloutBatch) -> Tensor:
    """[B] bool: the rollout solved its task (the `correctness` reward if listed, else weighted reward > 0)."""
    rewards = torch.nan_to_num(batch.rewards, nan=0.0)
    if "correctness" in batch.reward_names:
        return rewards[:, batch.reward_names.index("correctness")] >= 1.0
    return rewards @ batch.reward_weights > 0


def reward_context(cfg: RLConfig, samples) -> dict[str, object]:
    """What rewards may declare they need besides the text (see rewards.reward_matrix)."""
    return {"lengths": samples.completion_mask.sum(-1).cpu(), "max_len": cfg.max_new_tokens, "overlong_buffer": cfg.overlong_buffer, "rl": cfg,
            "completion_ids": samples.completion_ids, "completion_attention": samples.attention}


def score_as_student(model, ctx: ExtraContext, batch: RolloutBatch, hidden: bool = False):
    """The batch's completions read by a frozen `model` after the student's own prompts (observations attended)."""
    return teacher_forward(model, batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.attention_mask, ctx.cfg.temperature, hidden)


def score_under(model, ctx: ExtraContext, context_texts: list[str | Example], batch: RolloutBatch, hidden: bool = False):
    """The batch's completions read by `model` after per-row contexts (no gradient): texts, or examples whose
    prompt is the context (`in_context`: a chat template then renders the example's system prompt too)."""
    ids, mask = encode_prompts(ctx.tokenizer, context_texts, batch.completion_ids.device)
    return teacher_forward(model, ids, mask, batch.completion_ids, batch.attention_mask, ctx.cfg.temperature, hidden)


def in_context(example: Example, text: str) -> Example:
    """`example` with `text` (a trainers/contexts framing of it) as its prompt, its system prompt kept: the teacher
    reads the instructions the student was sampled under."""
    return replace(example, prompt=text, messages=None)


def natural(ctx: ExtraContext) -> bool:
    """Whether the contexts are framed in words (a chat model) or in the character format (trainers/contexts.py)."""
    return uses_chat(ctx.tokenizer)


def decode_transcripts(tokenizer: PreTrainedTokenizerBase, batch: RolloutBatch) -> list[str]:
    """Each completion as the policy read it: its actions and the environment's observations (no EOS or padding)."""
    ids = batch.completion_ids.masked_fill(batch.attention_mask == 0, tokenizer.pad_token_id)
    return tokenizer.batch_decode(ids.cpu(), skip_special_tokens=True)


def episode_sampler(ctx: ExtraContext):
    return ctx.task.sampler(ctx.tokenizer) if hasattr(ctx.task, "sampler") else None  # whole episodes for multi-turn envs


# --- the reference and the policy's own baselines -----------------------------------------------------------

@extras.register("ref_logp", role="reference")
def reference_logp(ctx: ExtraContext, prompts, batch) -> Tensor:
    """[B, T] sampled-token log-probs under the frozen reference (the starting policy); a policy that is not a causal LM
    (`Policy.log_probs_only`) reads its reference its own way (`Policy.over`)."""
    reference = ctx.model("reference", "ref_logp")
    if ctx.adapter is not None and ctx.adapter.log_probs_only:
        with torch.no_grad():
            return ctx.adapter.over(reference).forward(batch, ctx.cfg.temperature).logp
    return score_as_student(reference, ctx, batch).logp


@extras.register("values", role="critic")
@torch.no_grad()
def values(ctx: ExtraContext, prompts, batch) -> Tensor:
    """[B, T] the critic's V(s_t) before each completion token at rollout time (0 off the loss mask): GAE's
    baseline and the value loss's old values."""
    critic = ctx.model("critic", "values")
    was_training = critic.training
    critic.eval()
    try:
        v = token_values(critic, batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.attention_mask)
    finally:
        critic.train(was_training)
    return v * batch.completion_mask.to(v.dtype)


@extras.register("greedy_rewards")
@torch.no_grad()
def greedy_rewards(ctx: ExtraContext, prompts, batch) -> Tensor:
    """[B] ReMax baseline: the weighted reward of one greedy completion of each row's prompt (NaN -> 0)."""
    samples, texts = generate(ctx.policy, ctx.tokenizer, [e.prompt for e in prompts], ctx.cfg.max_new_tokens, temperature=ctx.cfg.temperature, greedy=True)
    rewards, _, weights = reward_matrix(ctx.cfg.rewards, ctx.task, prompts, texts, samples.finished.tolist(), **reward_context(ctx.cfg, samples))
    per_prompt = torch.nan_to_num(rewards, nan=0.0) @ weights
    return per_prompt.to(batch.group.device)[batch.group]


def distribution_task(ctx: ExtraContext, need: str) -> Task:
    """The task, when it has outcomes and target distributions (e.g. `distribution`); else a UserError."""
    if callable(getattr(ctx.task, "outcome", None)) and callable(getattr(ctx.task, "target", None)):
        return ctx.task
    parts = ((ctx.cfg.advantage, advantages), (ctx.cfg.loss, losses), *((a, auxiliaries) for a in ctx.cfg.aux))
    who = " and ".join(n for n, registry in parts if need in registry.entry(n).meta.get("needs", ()))
    raise UserError(f"{who} needs a distribution-matching task (task.name: distribution); task {ctx.task.cfg.name!r} has no target distribution")


@extras.register("outcomes")
def outcomes(ctx: ExtraContext, prompts, batch) -> Tensor:
    """[B] 0-based index of each completion's outcome in its task's outcome set; -1 when unparseable."""
    task = distribution_task(ctx, "outcomes")
    found = [task.outcome(text) for text in decode_completions(ctx.tokenizer, batch)]
    return torch.tensor([-1 if k is None else k for k in found], device=batch.group.device)


@extras.register("target_probs")
def target_probs(ctx: ExtraContext, prompts, batch) -> Tensor:
    """[B, K] the target distribution stated by each row's prompt."""
    task = distribution_task(ctx, "target_probs")
    return torch.tensor([task.target(p) for p in prompts], device=batch.group.device)[batch.group]


@extras.register("train_step")
def train_step(ctx: ExtraContext, prompts, batch) -> Tensor:
    """The 1-based index of the current update (for warm starts and warm-down schedules)."""
    return torch.tensor(float(ctx.step))


# --- separate teacher / base models -------------------------------------------------------------------------

@extras.register("teacher_logp", role="teacher")
def teacher_logp(ctx: ExtraContext, prompts, batch) -> Tensor:
    """[B, T] sampled-token log-probs under the frozen teacher, same prompt as the student."""
    return score_as_student(ctx.model("teacher", "teacher_logp"), ctx, batch).logp


@extras.register("teacher_hidden", role="teacher")
def teacher_hidden(ctx: ExtraContext, prompts, batch) -> Tensor:
    """[L, B, T, d] hidden states of every layer of the frozen teacher on the student's rollouts."""
    return score_as_student(ctx.model("teacher", "teacher_hidden"), ctx, batch, hidden=True).hidden


@extras.register("base_hidden", role="base")
def base_hidden(ctx: ExtraContext, prompts, batch) -> Tensor:
    """[L, B, T, d] hidden states of the frozen pre-RL base (RIDE's B)."""
    return score_as_student(ctx.model("base", "base_hidden"), ctx, batch, hidden=True).hidden


@extras.register("teacher_logprobs", role="teacher")
def teacher_logprobs(ctx: ExtraContext, prompts, batch) -> Tensor:
    """[B, T, V] full next-token log-probs of the frozen teacher."""
    return score_as_student(ctx.model("teacher", "teacher_logprobs"), ctx, batch).logprobs


@extras.register("base_logprobs", role="base")
def base_logprobs(ctx: ExtraContext, prompts, batch) -> Tensor:
    """[B, T, V] full next-token log-probs of the frozen base."""
    return score_as_student(ctx.model("base", "base_logprobs"), ctx, batch).logprobs


# --- self-teachers: the policy with privileged context ------------------------------------------------------

@extras.register("privileged_logprobs")
def privileged_logprobs(ctx: ExtraContext, prompts, batch) -> Tensor:
    """[B, T, V] OPSD's teacher: the policy itself, told the reference solution."""
    texts = [in_context(e, contexts.answer_context(e, natural(ctx))) for e in row_examples(prompts, batch)]
    return score_under(ctx.policy, ctx, texts, batch).logprobs


@extras.register("contrast_logp_gap")
def contrast_logp_gap(ctx: ExtraContext, prompts, batch) -> Tensor:
    """[B, T] SIPO's d = logp(y | x, C+) - logp(y | x, C-), the policy as a contrastive self-teacher."""
    limit = ctx.cfg.options_for("sipo").max_mistakes
    examples, texts, ok = row_examples(prompts, batch), decode_completions(ctx.tokenizer, batch), success(batch).tolist()
    positive, negative = [""] * batch.size, [""] * batch.size
    for rows in group_rows(batch):
        for own in rows:
            mistakes = contexts.group_mistakes([texts[j] for j in rows], [ok[j] for j in rows], rows.index(own), limit)
            pair = contexts.contrastive_contexts(examples[own], mistakes, natural(ctx))
            positive[own], negative[own] = (in_context(examples[own], text) for text in pair)
    return score_under(ctx.policy, ctx, positive, batch).logp - score_under(ctx.policy, ctx, negative, batch).logp


@extras.register("peer_logp_gap")
def peer_logp_gap(ctx: ExtraContext, prompts, batch) -> Tensor:
    """[B, T] UniOPSD's Delta = logp_T - logp_S, the teacher being the policy with another successful rollout of
    the same group in context (its whole transcript, observations included); 0 on rows with no such peer
    (untaught rows: groups without a success, and a group's lone success)."""
    examples, ok = row_examples(prompts, batch), success(batch).tolist()
    texts = decode_transcripts(ctx.tokenizer, batch)
    peers = successful_peers(ok, batch.group.tolist())
    peer_texts = [in_context(e, contexts.peer_context(e, texts[j] if j is not None else "", natural(ctx))) for e, j in zip(examples, peers)]
    teacher = score_under(ctx.policy, ctx, peer_texts, batch).logp
    gap = (teacher - batch.old_logp) * batch.completion_mask
    return gap * torch.tensor([j is not None for j in peers], dtype=gap.dtype, device=gap.device)[:, None]


@extras.register("trace_logprobs", role="teacher", optional_role=True)
@torch.no_grad()
def trace_logprobs(ctx: ExtraContext, prompts, batch) -> Tensor:
    """[B, T, V] ThinkOPD's teacher with a think trace z in context: z is the reasoning part (`Task.think_trace`:
    the worked steps before the answer, on a task that writes them) of the teacher's own greedy response to the
    prompt, generated once per prompt and shared by the group. The teacher is the `teacher` model when one is
    given, else the policy (same-model setting)."""
    model = ctx.models.get("teacher", ctx.policy)
    _, traces = generate(model, ctx.tokenizer, [e.prompt for e in prompts], ctx.cfg.max_new_tokens, greedy=True)
    _, index = torch.unique(batch.group, return_inverse=True)
    texts = [in_context(prompts[g], contexts.trace_context(prompts[g], ctx.task.think_trace(traces[g]), natural(ctx))) for g in index.tolist()]
    return score_under(model, ctx, texts, batch).logprobs


@extras.register("skill_hidden")
@torch.no_grad()
def skill_hidden(ctx: ExtraContext, prompts, batch) -> Tensor:
    """[L, B, T, d] PR-OPD's teacher: the policy re-reading its own response with a hindsight skill k_i it
    wrote itself after a reflection prompt holding the task, its trajectory and the outcome (see `write_skills`).
    Empty during the GRPO warm start."""
    opts = ctx.cfg.options_for("pr_opd")
    if ctx.step <= opts.warm_start:  # no skills written, no teacher pass
        return torch.empty(0)
    examples, ok = row_examples(prompts, batch), success(batch).tolist()
    reflections = [contexts.reflection_prompt(e, t, s) for e, t, s in zip(examples, decode_transcripts(ctx.tokenizer, batch), ok)]
    skills = write_skills(ctx, examples, reflections)
    return score_under(ctx.policy, ctx, [contexts.skill_context(e, k) for e, k in zip(examples, skills)], batch, hidden=True).hidden


def write_skills(ctx: ExtraContext, examples: list[Example], reflections: list[str]) -> list[str]:
    """One hindsight skill per reflection: picked by the policy from the task's skill vocabulary when it has
    one (sampled from the policy's own log-probs of each candidate after the reflection), else `skill_tokens`
    sampled tokens; a skill that is the answer (pr_opd.admissible_skill) becomes "" (no teacher signal)."""
    opts = ctx.cfg.options_for("pr_opd")
    vocabulary = getattr(ctx.task, "skill_vocabulary", None)
    if vocabulary is None:
        _, skills = generate(ctx.policy, ctx.tokenizer, reflections, opts.skill_tokens, temperature=ctx.cfg.temperature, generator=ctx.generator)
    else:
        candidates = list(vocabulary())
        chosen = pick_skills(candidate_logp(ctx, reflections, candidates), ctx.cfg.temperature, ctx.generator)
        skills = [candidates[k] for k in chosen.tolist()]
    return [k if admissible_skill(k, e.completion, ctx.task.correctness_reward(k, True, e) > 0) else "" for k, e in zip(skills, examples)]


def candidate_logp(ctx: ExtraContext, contexts_: list[str], candidates: list[str]) -> Tensor:
    """[N, V] the policy's log-probability of each candidate text after each context (no gradient)."""
    device = ctx.device
    ids, mask = encode_prompts(ctx.tokenizer, [c for c in contexts_ for _ in candidates], device)
    encoded = [ctx.tokenizer(c, add_special_tokens=False).input_ids for c in candidates]
    width = max(map(len, encoded))
    comp = torch.full((len(candidates), width), ctx.tokenizer.pad_token_id, dtype=torch.long, device=device)
    comp_mask = torch.zeros_like(comp)
    for v, row in enumerate(encoded):
        comp[v, : len(row)], comp_mask[v, : len(row)] = torch.tensor(row, device=device), 1
    comp, comp_mask = comp.repeat(len(contexts_), 1), comp_mask.repeat(len(contexts_), 1)
    logp = teacher_forward(ctx.policy, ids, mask, comp, comp_mask, ctx.cfg.temperature, full=False).logp
    return (logp * comp_mask).sum(-1).view(len(contexts_), len(candidates))


@extras.register("retrospections")
@torch.no_grad()
def retrospections(ctx: ExtraContext, prompts, batch) -> Tensor:
    """[B, 3, W] ROFT: for each attempt, a retrospection sampled on-policy from the current model after a
    prompt holding the attempt and the environment's feedback (its outcome); rows are (token ids, attention mask, loss mask),
    the loss mask being 1 on retrospection tokens only. The trainer's policy forward scores the token ids."""
    opts = ctx.cfg.options_for("roft")
    examples, texts, ok = row_examples(prompts, batch), decode_completions(ctx.tokenizer, batch), success(batch).tolist()
    # the environment's feedback only: the outcome (observations of a multi-turn episode are already in the attempt);
    # never the reference answer, which would make ROFT hint-conditioned self-imitation
    feedback = [contexts.OUTCOME_OK if s else contexts.OUTCOME_FAILED for s in ok]
    retro_prompts = [contexts.retrospection_prompt(e, t, f) for e, t, f in zip(examples, texts, feedback)]
    ids, mask = encode_prompts(ctx.tokenizer, retro_prompts, batch.group.device)
    retro, _ = generate(ctx.policy, ctx.tokenizer, retro_prompts, opts.max_tokens, temperature=opts.temperature, generator=ctx.generator)
    width = ids.shape[1] + retro.completion_ids.shape[1]
    out = torch.zeros(batch.size, 3, width, dtype=torch.long, device=ids.device)
    out[:, 0] = torch.cat([ids, retro.completion_ids], 1)
    out[:, 1] = torch.cat([mask, retro.completion_mask], 1)
    out[:, 2, ids.shape[1]:] = retro.completion_mask
    return out


# --- schedules with state -----------------------------------------------------------------------------------

@torch.no_grad()
def measure_success(ctx: ExtraContext, model, prompts: list[Example], samples_per_prompt: int) -> float:
    """Mean verifier success of `model` sampled on `prompts` (GATS's fixed teacher reference S_T)."""
    out, texts = generate(
        model, ctx.tokenizer, [e.prompt for e in prompts], ctx.cfg.max_new_tokens, group_size=samples_per_prompt,
        temperature=ctx.cfg.temperature, generator=ctx.generator, sampler=episode_sampler(ctx),
    )
    rows = [e for e in prompts for _ in range(samples_per_prompt)]
    return sum(ctx.task.correctness_reward(t, f, e) for t, f, e in zip(texts, out.finished.tolist(), rows)) / len(rows)


@extras.register("gats_weight", role="teacher", state=GATSState)
def gats_weight(ctx: ExtraContext, prompts, batch) -> Tensor:
    """[B] GATS's w(k), after updating the student's success EMA with this batch (the provider's state)."""
    opts = ctx.cfg.options_for("gats")
    state: GATSState = ctx.state
    if state.teacher_success is None:
        state.teacher_success = opts.teacher_success if opts.teacher_success is not None else measure_success(
            ctx, ctx.model("teacher", "gats"), prompts, ctx.cfg.group_size
        )
    state.update(float(success(batch).float().mean()), opts)
    w = gap_weight(state.student_success, state.teacher_success, opts, state.latched)
    return torch.full((batch.size,), w, device=batch.group.device)


@extras.register("uniopsd_rho", state=TrustState)
def uniopsd_rho(ctx: ExtraContext, prompts, batch) -> Tensor:
    """UniOPSD's shrunken historical correlation rho_used (from steps before this one); then folds this
    step's Pearson corr(A^S, A^O) into the EMA for the next step (the provider's state)."""
    opts = ctx.cfg.options_for("uniopsd")
    state: TrustState = ctx.state
    used = state.rho_used(opts)
    gap = batch.extras["peer_logp_gap"] if "peer_logp_gap" in batch.extras else peer_logp_gap(ctx, prompts, batch)
    tier = step_tier(batch, gap, ctx.cfg, opts)
    state.update(tier.a_step, tier.a_teacher, tier.both, opts)
    return torch.tensor(used)
