"""Teachers and the auxiliary distillation terms: OPSD, ThinkOPD, RIDE, PR-OPD,
ROFT: every listed invariant, on hand-made tensors or a micro model."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from posttrain import resolve
from posttrain.errors import UserError
from posttrain.errors import assert_no_grad
from posttrain.models.logprobs import completion_forward, sequence_logprobs
from posttrain.models.teacher import freeze, load_teacher, teacher_forward
from posttrain.trainers import contexts
from posttrain.objectives.distill.divergence import jsd, reverse_kl
from posttrain.objectives.distill.pr_opd import Projectors, representation_loss
from posttrain.objectives.distill.ride import directional_objective, ride_loss, ride_target
from posttrain.objectives.distill.roft import retrospection_nll
from posttrain.objectives.distill.think_opd import route_weights, routed_loss
from posttrain.rollout import PolicyOutputs, RolloutBatch

PARAMS = Path(__file__).resolve().parents[2] / "params.yaml"


@pytest.fixture(scope="module")
def micro(char_tokenizer):
    from posttrain.models import build_tiny
    from posttrain.tasks import build_task
    from posttrain.trainers.online_rl import RLRun

    cfg = resolve.load(PARAMS, ["model.hidden_size=32", "model.intermediate_size=64", "model.layers=2", "rl.max_new_tokens=4"])
    torch.manual_seed(0)
    model = build_tiny(cfg.model, char_tokenizer)
    task = build_task(cfg.task)
    examples = task.splits(0)["train"][:2]
    return RLRun(model, char_tokenizer, task, examples, cfg.rl, 0, Path("unused"), "x"), examples


def context(run, state=None, seed=0, cfg=None, policy=None):
    """What a provider reads, for the run's policy (or `policy`) and settings (or `cfg`)."""
    from posttrain.trainers.extras import ExtraContext

    return ExtraContext(policy or run.policy, run.tokenizer, run.task, cfg or run.cfg, {}, 1, torch.Generator().manual_seed(seed), state)


def student(run, batch, hidden=False):
    """The trainer's policy forward as the auxiliary terms receive it."""
    out = completion_forward(run.policy, batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.attention_mask, full=True, hidden=hidden)
    return PolicyOutputs(out.logp, logprobs=out.logprobs, hidden=out.hidden)


def rollouts(run, examples, group_size=3, correct=(1.0, 0.0, 0.0)):
    from posttrain.rollout.sampling import encode_prompts, sample

    tok = run.tokenizer
    ids, mask = encode_prompts(tok, [e.prompt for e in examples], torch.device("cpu"))
    out = sample(run.policy, ids, mask, group_size=group_size, max_new_tokens=4, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, generator=torch.Generator().manual_seed(0))
    n = out.completion_ids.shape[0]
    rewards = torch.tensor([correct[i % group_size] for i in range(n)])[:, None]
    return RolloutBatch(
        ids.repeat_interleave(group_size, 0), mask.repeat_interleave(group_size, 0), out.completion_ids, out.completion_mask,
        torch.arange(len(examples)).repeat_interleave(group_size), out.logp, rewards, ("correctness",), torch.ones(1),
    )


# --- teachers --------------------------------------------------------------------------------------------

def test_teacher_tensors_carry_no_gradient(micro, tmp_path):
    from posttrain.models import save_pretrained

    run, examples = micro
    batch = rollouts(run, examples)
    out = teacher_forward(run.policy, batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask, hidden=True)
    assert not out.logprobs.requires_grad and not out.hidden.requires_grad
    assert any(p.requires_grad for p in run.policy.parameters())  # the self-teacher read leaves the policy trainable
    with pytest.raises(AssertionError, match="gradient"):
        assert_no_grad(teacher=torch.zeros(1, requires_grad=True))
    save_pretrained(run.policy, run.tokenizer, tmp_path / "teacher")
    teacher = load_teacher(tmp_path / "teacher", run.tokenizer, "float32", torch.device("cpu"))
    assert not any(p.requires_grad for p in teacher.parameters()) and not teacher.training


def test_teacher_with_another_vocabulary_is_refused(micro, tmp_path):
    from posttrain.models import save_pretrained, train_char_tokenizer

    run, _ = micro
    save_pretrained(run.policy, train_char_tokenizer(["0123456789-=+*xyz"]), tmp_path / "other")
    with pytest.raises(UserError, match="tokenizer"):
        load_teacher(tmp_path / "other", run.tokenizer, "float32", torch.device("cpu"))


def test_identical_teacher_and_student_contexts_give_zero_opd_advantage(micro):
    from posttrain.objectives.distill.opd import opd_token_advantage

    run, examples = micro
    batch = rollouts(run, examples)
    teacher = teacher_forward(freeze(copy.deepcopy(run.policy)), batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask)
    adv = opd_token_advantage(teacher.logp, batch.old_logp, batch.completion_mask)
    assert adv.abs().max() < 1e-4


# --- OPSD / divergences ----------------------------------------------------------------------------------

def test_token_divergences_are_nonnegative_and_zero_for_identical_distributions():
    s = torch.randn(3, 4, 9).log_softmax(-1)
    t = torch.randn(3, 4, 9).log_softmax(-1)
    assert (reverse_kl(s, t) >= -1e-6).all() and (jsd(s, t, 0.5) >= -1e-6).all()
    assert torch.allclose(reverse_kl(s, s.clone()), torch.zeros(3, 4), atol=1e-6)
    assert torch.allclose(jsd(s, s.clone(), 0.5), torch.zeros(3, 4), atol=1e-6)
    with pytest.raises(AssertionError):
        reverse_kl(s, t.requires_grad_())


def test_opsd_privileged_teacher_reads_the_reference_before_the_prompt(micro):
    from posttrain.trainers.extras import privileged_logprobs

    run, examples = micro
    batch = rollouts(run, examples)
    assert contexts.answer_context(examples[0]).endswith(examples[0].prompt) and examples[0].completion in contexts.answer_context(examples[0])
    teacher = privileged_logprobs(context(run), examples, batch)
    assert teacher.shape == (*batch.completion_ids.shape, len(run.tokenizer)) and not teacher.requires_grad


# --- ThinkOPD --------------------------------------------------------------------------------------------

def test_think_opd_weights_sum_to_g_are_positive_and_detached():
    reward = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 1.0], requires_grad=True)
    trd = torch.tensor([0.1, 0.5, 0.3, 0.9, 0.2, 0.4])
    group = torch.tensor([0, 0, 0, 1, 1, 1])
    w = route_weights(reward, trd, group, 1.0, 1.0, 1.0, 1e-6)
    assert torch.allclose(w[:3].sum(), torch.tensor(3.0)) and torch.allclose(w[3:].sum(), torch.tensor(3.0))
    assert (w > 0).all() and not w.requires_grad


def test_think_opd_equal_gains_and_divergences_give_uniform_weights():
    w = route_weights(torch.ones(4), torch.full((4,), 0.3), torch.zeros(4, dtype=torch.long), 1.0, 1.0, 1.0, 1e-6)
    assert torch.allclose(w, torch.ones(4))
    per_token, mask = torch.rand(4, 5), torch.ones(4, 5)
    assert torch.allclose(routed_loss(per_token, mask, w), per_token.mean(-1).mean())


def test_think_opd_weight_rises_with_reward_gain_and_falls_with_divergence():
    group = torch.zeros(3, dtype=torch.long)
    trd = torch.tensor([0.2, 0.2, 0.5])
    low = route_weights(torch.tensor([0.0, 0.0, 1.0]), trd, group, 1.0, 1.0, 1.0, 1e-6)
    high = route_weights(torch.tensor([1.0, 0.0, 1.0]), trd, group, 1.0, 1.0, 1.0, 1e-6)
    assert high[0] > low[0]
    reward = torch.tensor([1.0, 0.0, 1.0])
    near = route_weights(reward, torch.tensor([0.1, 0.3, 0.5]), group, 1.0, 1.0, 1.0, 1e-6)
    far = route_weights(reward, torch.tensor([0.4, 0.3, 0.5]), group, 1.0, 1.0, 1.0, 1e-6)
    assert far[0] < near[0]


# --- RIDE ------------------------------------------------------------------------------------------------

def test_ride_target_is_the_teacher_at_lambda_one_or_when_rl_changed_nothing():
    h_t, h_b = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 4, 8)
    assert torch.equal(ride_target(h_t, h_b, 1.0), h_t)
    for lam in (0.5, 1.5, 3.0):
        assert torch.allclose(ride_target(h_t, h_t.clone(), lam), h_t)
    assert torch.allclose(ride_target(h_t, h_b, 2.0), 2 * h_t - h_b)


def test_ride_loss_gradient_is_minus_the_directional_reward_gradient():
    h_t, h_b = torch.randn(1, 1, 5, 6), torch.randn(1, 1, 5, 6)
    h_s = torch.randn(1, 1, 5, 6, requires_grad=True)
    lam = 1.7
    mask = torch.ones(1, 5)
    # ride_loss is the masked mean over 5 positions of the squared distance: 5 * loss is the sum form
    (grad_loss,) = torch.autograd.grad(5 * ride_loss(h_s, h_t, h_b, mask, lam), h_s)
    (grad_j,) = torch.autograd.grad(directional_objective(h_s, h_t, h_b, lam), h_s)
    assert torch.allclose(grad_loss, -grad_j, atol=1e-5)


def test_ride_loss_is_zero_exactly_at_the_target_and_refuses_teacher_gradient():
    h_t, h_b = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 4, 8)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    target = ride_target(h_t, h_b, 1.5)
    assert ride_loss(target.clone(), h_t, h_b, mask, 1.5) == 0
    off_mask = target.clone()
    off_mask[:, 0, 3] += 1.0  # a padded position
    assert ride_loss(off_mask, h_t, h_b, mask, 1.5) == 0
    assert ride_loss(target + 0.1, h_t, h_b, mask, 1.5) > 0
    with pytest.raises(AssertionError):
        ride_loss(target, h_t.requires_grad_(), h_b, mask, 1.5)


# --- PR-OPD ----------------------------------------------------------------------------------------------

def test_pr_opd_representation_loss_is_nonnegative_zero_with_identity_and_depth_independent():
    h_s, h_t = torch.randn(3, 2, 4, 8), torch.randn(3, 2, 4, 8)
    mask = torch.ones(2, 4)
    identity = Projectors(3, 8)
    assert representation_loss(h_t.clone(), h_t, mask, identity) == 0
    value = representation_loss(h_s, h_t, mask, identity)
    assert value > 0
    doubled = representation_loss(torch.cat([h_s, h_s]), torch.cat([h_t, h_t]), mask, Projectors(6, 8))
    assert torch.allclose(doubled, value)
    with pytest.raises(AssertionError):
        representation_loss(h_s, h_t.requires_grad_(), mask)


def test_pr_opd_empty_skill_teacher_pass_equals_student_pass(micro):
    run, examples = micro
    batch = rollouts(run, examples)
    assert contexts.skill_context(examples[0], "") == examples[0].prompt
    from posttrain.trainers.extras import row_examples, score_under

    teacher = score_under(run.policy, context(run), [contexts.skill_context(e, "") for e in row_examples(examples, batch)], batch, hidden=True).hidden
    with torch.no_grad():
        own = student(run, batch, hidden=True).hidden
    assert representation_loss(own, teacher, batch.completion_mask, Projectors(teacher.shape[0], teacher.shape[-1])) < 1e-10


def test_pr_opd_with_zero_weight_or_in_warm_start_adds_nothing(micro):
    from posttrain.objectives import auxiliaries

    run, examples = micro
    batch = rollouts(run, examples).with_extras(skill_hidden=torch.randn(2, 6, 4, 32), train_step=torch.tensor(1.0))
    projectors = Projectors(2, 32)
    for opts in ({"lam_rep": 0.0, "warm_start": 0}, {"lam_rep": 1.0, "warm_start": 5}):
        cfg = resolve.updated(run.cfg, "rl", options={"pr_opd": opts})
        loss, _ = auxiliaries.get("pr_opd")(batch, student(run, batch, hidden=True), cfg, projectors)
        assert float(loss) == 0.0 and not loss.requires_grad  # the projectors get no gradient, so they are not stepped
    cfg = resolve.updated(run.cfg, "rl", options={"pr_opd": {"lam_rep": 1.0, "warm_start": 0}})
    loss, _ = auxiliaries.get("pr_opd")(batch, student(run, batch, hidden=True), cfg, projectors)
    loss.backward()
    assert float(loss.detach()) > 0 and all(p.grad is not None for p in projectors.parameters())  # trained through the trainer's backward


def test_pr_opd_reflection_holds_the_trajectory_and_its_outcome_and_does_not_end_with_the_task_prompt():
    from posttrain.tasks import Example

    e = Example(prompt="c1>", completion="r2>s", answer="2")
    ok, failed = contexts.reflection_prompt(e, "l0>s", True), contexts.reflection_prompt(e, "l0>s", False)
    assert ok.startswith("c1>") and "l0>s" in ok and ok != failed
    assert ok.endswith(contexts.OUTCOME_OK + contexts.SEP) and failed.endswith(contexts.OUTCOME_FAILED + contexts.SEP)
    assert not ok.endswith(e.prompt)  # what follows is a lesson on the episode, not another answer to the task


def test_pr_opd_a_skill_that_is_the_answer_is_rejected():
    from posttrain.objectives.distill.pr_opd import admissible_skill
    from posttrain.tasks import build_task

    assert not admissible_skill("42", "42", solves=True)  # the arithmetic answer itself
    assert not admissible_skill("so 42", "42", solves=False)  # contains the reference completion
    assert admissible_skill("carry the 1", "42", solves=False)
    world = build_task(resolve.load(PARAMS, ["task.name=text_world", "task.n_train=60", "task.n_heldout=20"]).task)
    e = world.example("c", 1)  # goal of room c is cell 2: the answer is the walk `r2>s`
    for skill, verdict in (("rs", False), ("r2>s", False), ("g2", True), ("g4", True)):
        assert admissible_skill(skill, e.completion, world.correctness_reward(skill, True, e) > 0) is verdict, skill
    assert all(admissible_skill(k, e.completion, world.correctness_reward(k, True, e) > 0) for k in world.skill_vocabulary())


def test_pr_opd_text_world_skills_are_picked_after_reflection_and_change_the_teacher(tmp_path):
    """On the text world the policy picks each skill from the task's vocabulary by its own log-probs after the
    reflection prompt (which depend on the trajectory), and the skill-reading teacher's hidden states differ
    from the plain student pass: L_rep at identity projectors is > 0."""
    from posttrain.envs.rollout import env_sampler
    from posttrain.envs.text_world import KeyRoom
    from posttrain.models import build_tiny, train_char_tokenizer
    from posttrain.rollout.sampling import encode_prompts
    from posttrain.tasks import build_task
    from posttrain.trainers.extras import ExtraContext, candidate_logp, decode_transcripts, row_examples, skill_hidden, write_skills

    cfg = resolve.load(PARAMS, ["task.name=text_world", "task.n_train=60", "task.n_heldout=20", "model.hidden_size=32", "model.intermediate_size=64",
                                "model.layers=2", "rl.options.pr_opd.warm_start=0"])
    task = build_task(cfg.task)
    tok = train_char_tokenizer([task.alphabet()])
    torch.manual_seed(0)
    model = build_tiny(cfg.model, tok)
    examples = task.splits(0)["train"][:3]
    ids, mask = encode_prompts(tok, [e.prompt for e in examples], torch.device("cpu"))
    out = env_sampler(tok, KeyRoom)(model, ids, mask, group_size=2, max_new_tokens=6, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                                     generator=torch.Generator().manual_seed(0))
    batch = RolloutBatch(ids.repeat_interleave(2, 0), mask.repeat_interleave(2, 0), out.completion_ids, out.completion_mask,
                         torch.arange(3).repeat_interleave(2), out.logp, torch.tensor([[1.0], [0.0]] * 3), ("correctness",), torch.ones(1),
                         attention_mask=out.attention_mask)
    ctx = ExtraContext(model, tok, task, cfg.rl, {}, 1, torch.Generator().manual_seed(0))
    rows = row_examples(examples, batch)
    reflections = [contexts.reflection_prompt(e, t, i % 2 == 0) for i, (e, t) in enumerate(zip(rows, decode_transcripts(tok, batch)))]
    assert all(t in r for t, r in zip(decode_transcripts(tok, batch), reflections))
    scores = candidate_logp(ctx, reflections, task.skill_vocabulary())
    assert scores.shape == (6, 5) and (scores < 0).all() and not torch.allclose(scores[0], scores[1])  # read after the episode
    skills = write_skills(ctx, rows, reflections)
    assert all(k in task.skill_vocabulary() for k in skills)
    teacher = skill_hidden(ctx, examples, batch)
    with torch.no_grad():
        own = completion_forward(model, batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.attention_mask, hidden=True).hidden
    assert representation_loss(own, teacher, batch.completion_mask, Projectors(teacher.shape[0], teacher.shape[-1])) > 1e-4


# --- ROFT ------------------------------------------------------------------------------------------------

def test_roft_loss_mask_covers_retrospection_tokens_only(micro):
    from posttrain.trainers.extras import retrospections

    run, examples = micro
    batch = rollouts(run, examples)
    retro = retrospections(context(run), examples, batch)
    ids, attention, loss_mask = retro[:, 0], retro[:, 1], retro[:, 2]
    prompt_width = ids.shape[1] - run.cfg.options_for("roft").max_tokens
    assert (loss_mask[:, :prompt_width] == 0).all()
    assert (loss_mask[:, prompt_width:].sum(-1) >= 1).all()  # at least one sampled token per row
    assert ((loss_mask == 1) <= (attention == 1)).all()


def test_roft_retrospection_reads_the_outcome_not_the_reference(micro):
    """The retrospection prompt holds the attempt and the environment's feedback (success or failure), never the
    reference answer: a failed attempt's prompt is the same whatever the reference."""
    from posttrain.trainers import contexts
    from posttrain.trainers.extras import decode_completions, retrospections

    run, examples = micro
    batch = rollouts(run, examples)  # rewards 1, 0, 0 per group
    retro = retrospections(context(run), examples, batch)
    width = retro.shape[2] - run.cfg.options_for("roft").max_tokens
    texts = decode_completions(run.tokenizer, batch)
    for i, text in enumerate(texts):
        example = examples[i // 3]
        prompt = run.tokenizer.decode(retro[i, 0, :width][retro[i, 1, :width] == 1])
        label = contexts.OUTCOME_OK if i % 3 == 0 else contexts.OUTCOME_FAILED
        assert prompt == contexts.retrospection_prompt(example, text, label)
        if i % 3:
            assert example.completion + contexts.SEP not in prompt.removesuffix(example.prompt)


def test_roft_gradient_does_not_read_the_reward(micro):
    from posttrain.objectives import auxiliaries

    run, examples = micro
    retro = torch.zeros(2, 3, 6, dtype=torch.long)
    retro[:, 0] = torch.tensor([[3, 4, 5, 6, 7, 1], [3, 5, 5, 6, 8, 1]])
    retro[:, 1], retro[:, 2, 3:] = 1, 1
    grads = []
    for correct in ((1.0, 0.0, 0.0), (0.0, 1.0, 1.0)):
        batch = rollouts(run, examples, correct=correct).with_extras(retrospections=retro)
        run.policy.zero_grad()
        scored = {"retrospections": sequence_logprobs(run.policy, retro[:, 0], retro[:, 1])}
        loss, _ = auxiliaries.get("roft")(batch, PolicyOutputs(None, scored=scored), run.cfg, None)
        loss.backward()
        grads.append([p.grad.clone() for p in run.policy.parameters()])
    run.policy.zero_grad()
    assert all(torch.equal(a, b) for a, b in zip(*grads))


def test_roft_empty_retrospection_contributes_nothing(micro):
    run, _ = micro
    retro = torch.zeros(2, 3, 5, dtype=torch.long)
    retro[:, 0], retro[:, 1] = 3, 1
    value = retrospection_nll(sequence_logprobs(run.policy, retro[:, 0], retro[:, 1]), retro)
    assert value == 0 and not torch.isnan(value) and value.requires_grad


def test_roft_retrospections_are_sampled_from_the_current_policy(micro):
    from posttrain.trainers.extras import retrospections

    run, examples = micro
    batch = rollouts(run, examples)
    first = retrospections(context(run), examples, batch)
    assert torch.equal(first, retrospections(context(run), examples, batch))  # drawn from the trainer's generator only
    changed = copy.deepcopy(run.policy)
    with torch.no_grad():
        changed.lm_head.weight.mul_(-3.0)  # tied to the embeddings: a different model
    assert not torch.equal(first, retrospections(context(run, policy=changed), examples, batch))


def test_declared_states_survive_a_weights_only_checkpoint(tmp_path):
    from posttrain.objectives.distill.gats import GATSState
    from posttrain.objectives.distill.uniopsd import TrustState

    states = {"gats_weight": GATSState(0.4, 0.6, True), "uniopsd_rho": TrustState(0.3, 12)}
    torch.save({name: state.state_dict() for name, state in states.items()}, tmp_path / "trainer.pt")
    saved = torch.load(tmp_path / "trainer.pt", weights_only=True)
    restored = {"gats_weight": GATSState(), "uniopsd_rho": TrustState()}
    for name, state in restored.items():
        state.load_state_dict(saved[name])
    assert restored == states


@pytest.mark.parametrize("name,need", [("opsd", "privileged_logprobs"), ("think_opd", "trace_logprobs")])
def test_distillation_terms_vanish_at_zero_weight_and_for_an_identical_teacher(micro, name, need):
    from posttrain.objectives import auxiliaries

    run, examples = micro
    batch = rollouts(run, examples)
    policy = student(run, batch)
    own = policy.logprobs.detach()
    same = batch.with_extras(**{need: own})
    loss, _ = auxiliaries.get(name)(same, policy, run.cfg, None)
    assert abs(float(loss.detach())) < 1e-6  # the teacher is the student: divergence 0
    other = batch.with_extras(**{need: torch.randn_like(own).log_softmax(-1)})
    assert float(auxiliaries.get(name)(other, policy, run.cfg, None)[0].detach()) > 0
    cfg = resolve.updated(run.cfg, "rl", options={name: {"weight": 0.0}})
    assert float(auxiliaries.get(name)(other, policy, cfg, None)[0].detach()) == 0.0
